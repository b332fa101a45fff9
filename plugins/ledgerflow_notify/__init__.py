"""The ``notify`` plugin: tells someone an approval was requested, decided or expired.

Registered as ``notify = "ledgerflow_notify"`` in the ``ledgerflow`` entry-point
group. It implements the three approval hooks (:mod:`ledgerflow.hookspecs`) and
sends each event, as one JSON object
``{"event": "requested" | "decided" | "expired", "run_id": ..., "request" | "decision": {...}}``,
to what the settings name (both may be set; neither: the plugin does nothing):

* ``LEDGERFLOW_NOTIFY_COMMAND``: a command (split like a shell would, not run by
  one) started with the event on its standard input and ``LEDGERFLOW_EVENT`` in
  its environment; it gets ``LEDGERFLOW_NOTIFY_TIMEOUT`` seconds (default 10).
* ``LEDGERFLOW_NOTIFY_URL``: an ``http://`` URL (e.g. a local relay to chat or
  mail) the event is POSTed to as ``application/json``.

Sending happens in a thread of its own so the driver's loop is not slowed; the
process waits for it (at most the timeout) before it exits. A failure is logged,
never raised: a notification is a courtesy, the ledger is the record.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
from typing import Any

from ledgerflow import hookimpl

log = logging.getLogger(__name__)


def _timeout() -> float:
    try:
        return float(os.environ.get("LEDGERFLOW_NOTIFY_TIMEOUT") or 10)
    except ValueError:
        return 10.0


def _run_command(command: str, event: str, body: bytes) -> None:
    import shlex  # here, not at import: every run loads this plugin, few notify
    try:
        subprocess.run(shlex.split(command), input=body, timeout=_timeout(), check=True,
                       env={**os.environ, "LEDGERFLOW_EVENT": event},
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("notify: %s failed: %s", command, exc)


def _post(url: str, body: bytes) -> None:
    if not url.startswith(("http://", "https://")):
        log.warning("notify: LEDGERFLOW_NOTIFY_URL must be an http(s) URL, given %r", url)
        return
    import urllib.request  # here, not at import: it pulls in http.client and ssl
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=_timeout()) as resp:
            resp.read()
    except OSError as exc:
        log.warning("notify: POST %s failed: %s", url, exc)


def send(event: str, run_id: str, what: str, data: dict[str, Any]) -> threading.Thread | None:
    """Send one event to the configured command and URL (in a thread; returned)."""
    command = os.environ.get("LEDGERFLOW_NOTIFY_COMMAND")
    url = os.environ.get("LEDGERFLOW_NOTIFY_URL")
    if not command and not url:
        return None
    body = json.dumps({"event": event, "run_id": run_id, what: data}, default=str,
                      sort_keys=True).encode()

    def work() -> None:
        if command:
            _run_command(command, event, body)
        if url:
            _post(url, body)

    t = threading.Thread(target=work, name=f"ledgerflow-notify-{event}")  # joined at exit
    t.start()
    return t


@hookimpl
def ledgerflow_approval_requested(run_id: str, request: dict[str, Any]) -> None:
    send("requested", run_id, "request", request)


@hookimpl
def ledgerflow_approval_decided(run_id: str, decision: dict[str, Any]) -> None:
    send("decided", run_id, "decision", decision)


@hookimpl
def ledgerflow_approval_expired(run_id: str, decision: dict[str, Any]) -> None:
    send("expired", run_id, "decision", decision)
