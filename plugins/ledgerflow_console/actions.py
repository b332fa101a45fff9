"""What the console changes: cancel, resume, approve, reject, through the CLI's functions.

Only reached with ``--allow-actions`` and the per-process token (the checks
live in :mod:`.app`). A resume is a new ``pipeline resume`` process, started
without a shell in a session of its own so it outlives the console; its
output goes to ``<ledger>.d/console/resume-<run>-<time>.log``.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ledgerflow
from ledgerflow.errors import InputError, NotResumableError, PipelineError

from .ledger import Ledger


class ActionUnsupported(PipelineError):
    """This ledgerflow has no function for the action (answered with 501)."""


_children: list[subprocess.Popen[bytes]] = []
_children_lock = threading.Lock()


def _reap() -> None:
    with _children_lock:
        _children[:] = [p for p in _children if p.poll() is None]


def cancel(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """Ask the run to cancel (``ledgerflow.cancel``, as ``pipeline cancel`` does)."""
    ledgerflow.cancel(run_id, store=ledger.store)
    return {"message": f"cancel requested for {run_id}; its driver stops within a second",
            "run_id": run_id}


def resume(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """Start ``pipeline resume RUN_ID --store LEDGER`` as a detached process.

    Raises:
        NotResumableError: the run succeeded or its driver is alive.
        InputError: the ledger is not a file another process can open.
    """
    _reap()
    run = ledger.run(run_id)
    head = ledger.head(run)
    if head.state == "succeeded":
        raise NotResumableError(f"run {run_id} already succeeded; nothing to resume",
                                hint="start a new run with: pipeline run ...")
    if head.driver_alive:
        raise NotResumableError(f"run {run_id} is still being driven (pid {head.driver_pid})",
                                hint="wait for it, or cancel it first")
    kind = ledger.store_kind(run)
    if kind not in ("duckdb", "postgres"):
        raise InputError(f"runs in a {kind!r} store cannot be resumed from another process",
                         hint="resume it from the process that holds the store")
    location = ledger.location(run)
    # a DuckDB ledger keeps the log beside it; a database URL has no folder: a temp one
    folder = (Path(location + ".d") if kind == "duckdb"
              else Path(tempfile.gettempdir()) / "ledgerflow-console") / "console"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"resume-{run_id}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    argv = [sys.executable, "-m", "ledgerflow", "resume", run_id, "--store", location]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)
    with _children_lock:
        _children.append(proc)
    return {"message": f"resume of {run_id} started (pid {proc.pid}); output in {log}",
            "run_id": run_id, "pid": proc.pid, "log": str(log), "argv": argv}


def _call(fn: Callable[..., Any], *args: object, **kwargs: object) -> Any:
    """Call ``fn`` with the keyword arguments it declares (its exact names may vary)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(*args, **{k: v for k, v in kwargs.items() if v is not None})


def _decide(ledger: Ledger, run_id: str, body: Mapping[str, Any], verb: str) -> dict[str, Any]:
    fn = getattr(ledgerflow, verb, None)
    if not callable(fn):
        raise ActionUnsupported(f"this ledgerflow has no {verb}() yet",
                                hint=f"use: pipeline {verb} RUN_ID TASK_KEY, or upgrade")
    task_key = body.get("task_key")
    if not isinstance(task_key, str) or not task_key:
        raise InputError(f"{verb} needs the task_key of the request",
                         hint='send {"task_key": "...", "digest": "..."}')
    digest = body.get("digest")
    reason = body.get("reason")
    if verb == "approve" and not digest:
        raise InputError("approve needs the digest of what is approved",
                         hint="copy it from the approvals table: pipeline approvals RUN_ID")
    if verb == "reject" and not reason:
        raise InputError("reject needs a reason", hint='send {"reason": "..."}')
    names: dict[str, object] = {}
    who = body.get("as")
    if isinstance(who, str) and who:     # the approver's name, under the name fn uses
        params = inspect.signature(fn).parameters
        for name in ("by", "as_", "approver", "decided_by", "user"):
            if name in params:
                names[name] = who
                break
    result = _call(fn, run_id, task_key, digest=digest, reason=reason, store=ledger.store,
                   **names)
    done = "approved" if verb == "approve" else "rejected"
    doc: dict[str, Any] = {"message": f"{task_key} of run {run_id} {done}", "run_id": run_id,
                           "task_key": task_key}
    if isinstance(result, Mapping):
        doc["decision"] = dict(result)
    return doc


def approve(ledger: Ledger, run_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Approve a pending request (``ledgerflow.approve``) with its digest."""
    return _decide(ledger, run_id, body, "approve")


def reject(ledger: Ledger, run_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Reject a pending request (``ledgerflow.reject``) with a reason."""
    return _decide(ledger, run_id, body, "reject")
