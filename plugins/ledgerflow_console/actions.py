"""What the console changes: cancel, resume, approve, reject, through the CLI's functions.

An approval of a tool call may carry ``arguments`` (the edit, checked by
``ledgerflow.approve`` as ``pipeline approve --arguments`` is); every decision's
reply says what happens next (a live driver takes it, or it waits for a resume).

Only reached with ``--allow-actions`` and the per-process token, or for a
decision an approver's own token (the checks live in :mod:`.access`). A resume is a new ``pipeline resume`` process, started
without a shell in a session of its own so it outlives the console. The store
goes to it in ``LEDGERFLOW_STORE`` (its environment, readable only by its
user), never on its command line, which every local user can read: a
PostgreSQL URL may hold a password. Its output goes to a new file (created
``O_EXCL | O_NOFOLLOW``, mode 0600) in ``<ledger>.d/console/`` for a DuckDB
ledger, or, for a database URL (no folder), in a private folder this console
process makes with :func:`tempfile.mkdtemp` (mode 0700, an unpredictable
name): never a fixed path under the shared temporary directory, which another
local user could create first.
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
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
from ledgerflow.identity import Verified, decider

from .access import Forbidden
from .ledger import Ledger


class ActionUnsupported(PipelineError):
    """This ledgerflow has no function for the action (answered with 501)."""


_children: list[subprocess.Popen[bytes]] = []
_children_lock = threading.Lock()


def _reap() -> None:
    with _children_lock:
        _children[:] = [p for p in _children if p.poll() is None]


def cancel(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """Cancel the run as ``pipeline cancel`` does: its driver stops within a second; a
    run no process drives is taken over and cancelled by a detached ``pipeline cancel``
    (it loads the run's pipeline: never in the console's own process)."""
    _reap()
    run = ledger.run(run_id)
    head = ledger.head(run)
    kind = ledger.store_kind(run)
    if head.state in ("running", "cancelling", "waiting") and head.driver_alive is False \
            and kind in ("duckdb", "postgres"):
        location = ledger.location(run)
        argv = [sys.executable, "-m", "ledgerflow", "cancel", run_id]
        env = {**os.environ, "LEDGERFLOW_STORE": location}  # not argv: it may hold a password
        proc, log = _spawn(argv, env, _log_folder(location, kind), run_id, "cancel")
        return {"message": f"no process drives {run_id}: cancelling it (pid {proc.pid}); "
                f"output in {log}", "run_id": run_id, "pid": proc.pid, "log": str(log)}
    done = ledgerflow.cancel(run_id, store=ledger.store)
    message = (f"cancel requested for {run_id}; its driver stops within a second"
               if done == "requested" else f"run {run_id} cancelled")
    return {"message": message, "run_id": run_id}


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
    argv = [sys.executable, "-m", "ledgerflow", "resume", run_id]
    env = {**os.environ, "LEDGERFLOW_STORE": location}      # not argv: it may hold a password
    proc, log = _spawn(argv, env, _log_folder(location, kind), run_id)
    return {"message": f"resume of {run_id} started (pid {proc.pid}); output in {log}",
            "run_id": run_id, "pid": proc.pid, "log": str(log), "argv": argv}


def _spawn(argv: list[str], env: dict[str, str], folder: Path,
           *name: str) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``argv`` detached (its own session, no stdin), its output in a new private log
    in ``folder``; the console keeps the child to reap it."""
    log, out = _new_log(folder, *name)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True, env=env)
    finally:
        os.close(out)
    with _children_lock:
        _children.append(proc)
    return proc, log


_private: Path | None = None
_private_lock = threading.Lock()


def _log_folder(location: str, kind: str) -> Path:
    """Where resume logs go: beside a DuckDB ledger, else this process's private folder."""
    global _private
    if kind == "duckdb":
        folder = Path(location + ".d") / "console"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return folder
    with _private_lock:
        if _private is None or not _private.is_dir():
            # mode 0700 and a random name: no other local user can make or enter it
            _private = Path(tempfile.mkdtemp(prefix="ledgerflow-console-"))
        return _private


def _new_log(folder: Path, run_id: str, action: str = "resume") -> tuple[Path, int]:
    """A new log file in ``folder``, opened for writing: never an existing file or a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        name = (f"{action}-{run_id}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-"
                f"{secrets.token_hex(3)}.log")
        try:
            return folder / name, os.open(folder / name, flags, 0o600)
        except FileExistsError:
            continue


def _call(fn: Callable[..., Any], *args: object, **kwargs: object) -> Any:
    """Call ``fn`` with the keyword arguments it declares (its exact names may vary)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(*args, **{k: v for k, v in kwargs.items() if v is not None})


#: The longest reason a decision may carry (it is stored with the decision).
MAX_REASON = 2000
#: The fields a decision may have: anything else is a mistake of the caller.
_FIELDS = frozenset({"task_key", "digest", "reason", "as", "arguments"})


def _text(body: Mapping[str, Any], name: str, verb: str, limit: int) -> str | None:
    """``body[name]``: absent/null, or a string of printable text at most ``limit`` long.

    Raises:
        InputError: any other JSON type (an object, a number, a list...), control
            characters, or a longer text: answered 400, nothing is recorded.
    """
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(f"{verb}: {name} must be a string, given a JSON "
                         f"{_json_type(value)}", hint=f'send {{"{name}": "..."}}')
    if len(value) > limit:
        raise InputError(f"{verb}: {name} is {len(value):,} characters, more than {limit:,}",
                         hint=f"shorten the {name}")
    if any((ord(c) < 32 and c not in "\t\n") or ord(c) == 127 for c in value):
        raise InputError(f"{verb}: {name} holds control characters",
                         hint=f"send plain text as the {name}")
    return value


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", int: "number", float: "number"}.get(
        type(value), type(value).__name__)


def _decide(ledger: Ledger, run_id: str, body: Mapping[str, Any], verb: str,
            who: Verified | None) -> dict[str, Any]:
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise InputError(f"{verb}: unknown field(s) {', '.join(map(repr, unknown))}",
                         hint="send only " + ", ".join(sorted(_FIELDS)))
    fn = getattr(ledgerflow, verb, None)
    if not callable(fn):
        raise ActionUnsupported(f"this ledgerflow has no {verb}() yet",
                                hint=f"use: pipeline {verb} RUN_ID TASK_KEY, or upgrade")
    task_key = body.get("task_key")
    if not isinstance(task_key, str) or not task_key:
        raise InputError(f"{verb} needs the task_key of the request as a string",
                         hint='send {"task_key": "...", "digest": "..."}')
    digest = _text(body, "digest", verb, 200)
    reason = _text(body, "reason", verb, MAX_REASON)
    claimed = _text(body, "as", verb, 200)
    if verb == "approve" and not digest:
        raise InputError("approve needs the digest of what is approved",
                         hint="copy it from the approvals table: pipeline approvals RUN_ID")
    if verb == "reject" and not reason:
        raise InputError("reject needs a reason", hint='send {"reason": "..."}')
    name = _decider(who, claimed)
    _check_listed(ledger, run_id, task_key, name, verb)
    params = inspect.signature(fn).parameters
    names: dict[str, object] = {}
    for key in ("by", "as_", "approver", "decided_by", "user"):   # the name fn uses
        if key in params:
            names[key] = name
            break
    edit = _edit(body, verb, params)
    result = _call(fn, run_id, task_key, digest=digest, reason=reason, store=ledger.store,
                   **names, **edit)
    done = "approved" if verb == "approve" else "rejected"
    if edit:
        done += " with edited arguments " + json.dumps(edit["arguments"], sort_keys=True,
                                                       default=str)[:200]
    message = f"{task_key} of run {run_id} {done} by {name}"
    if isinstance(result, Mapping) and result.get("next"):
        message += f"; {result['next']}"        # what happens now: a driver, or a resume
    doc: dict[str, Any] = {"message": message,
                           "run_id": run_id, "task_key": task_key, "decided_by": str(name)}
    if isinstance(result, Mapping):
        doc["decision"] = dict(result)
    return doc


def _edit(body: Mapping[str, Any], verb: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``{"arguments": ...}`` of an approval that edits a tool call's arguments (checked by
    ledgerflow's approve as ``pipeline approve --arguments`` is: 400 when they do not fit),
    else nothing.

    Raises:
        InputError: arguments sent with a rejection.
        ActionUnsupported: this ledgerflow's approve takes no arguments.
    """
    if "arguments" not in body or body["arguments"] is None:
        return {}
    if verb != "approve":
        raise InputError("reject takes no arguments: only an approval may edit a tool call",
                         hint="approve with the edited arguments, or reject without them")
    if "arguments" not in params:
        raise ActionUnsupported("this ledgerflow cannot approve with edited arguments yet",
                                hint="approve as asked, or upgrade ledgerflow")
    return {"arguments": body["arguments"]}


def _decider(who: Verified | None, claimed: str | None) -> Verified:
    """Whose decision this is: the approver whose token came, else the console's OS user
    (or ``as``, where the approvers mapping allows that user)."""
    if who is None:
        return decider(claimed or None)
    if claimed and claimed != who:
        raise Forbidden(f"the approver token of {who!r} cannot decide as {claimed!r}",
                        hint=f"drop \"as\", or use {claimed!r}'s own token")
    return who


def _check_listed(ledger: Ledger, run_id: str, task_key: str, name: str, verb: str) -> None:
    """403 when the request names its approvers and ``name`` is not one of them (for a
    rejection too: a gate that lists who decides lists who rejects)."""
    rows = ledger.approvals(ledger.run(run_id)) or []
    waiting = [a for a in rows if a.get("task_key") == task_key
               and a.get("state") in (None, "pending", "waiting")]
    listed = [str(n) for n in (waiting[-1].get("approvers") or [])] if waiting else []
    if listed and name not in listed:
        raise Forbidden(f"{name!r} may not {verb} {task_key!r}; its approvers are: "
                        + ", ".join(listed),
                        hint="ask one of them to decide with their own approver token")


def approve(ledger: Ledger, run_id: str, body: Mapping[str, Any],
            who: Verified | None = None) -> dict[str, Any]:
    """Approve a pending request (``ledgerflow.approve``) with its digest, as ``who`` (an
    approver's token) or the console's OS user."""
    return _decide(ledger, run_id, body, "approve", who)


def reject(ledger: Ledger, run_id: str, body: Mapping[str, Any],
           who: Verified | None = None) -> dict[str, Any]:
    """Reject a pending request (``ledgerflow.reject``) with a reason, as :func:`approve`."""
    return _decide(ledger, run_id, body, "reject", who)


#: Parameters one start may pass, and the longest value.
START_PARAMS = 100
START_VALUE_CHARS = 10_000


def known_targets(ledger: Ledger) -> dict[str, str]:
    """The pipelines the console may start: each target already run in this ledger, with
    its newest run's id."""
    out: dict[str, str] = {}
    for v in ledger.runs(limit=1000):
        if v.target:
            out.setdefault(v.target, v.run_id)
    return dict(sorted(out.items()))


def start(ledger: Ledger, body: Mapping[str, Any]) -> dict[str, Any]:
    """Start ``pipeline run TARGET -p K=V ...`` as a detached process (a new run).

    ``body``: ``{"target": "flows.py:demo", "params": {"n": "5"}}``, values
    written as on the command line and typed as ``-p`` types them (the
    pipeline's hints). The target must be one already run in this ledger.

    Raises:
        InputError: an unknown target, a malformed parameter, or one the
            pipeline refuses (its one-line cause, as ``pipeline run`` says it).
    """
    _reap()
    unknown = set(body) - {"target", "params"}
    if unknown:
        raise InputError(f"unknown field(s) {', '.join(sorted(map(str, unknown)))}",
                         hint='send {"target": "...", "params": {"name": "value"}}')
    target, params = body.get("target"), body.get("params") or {}
    known = known_targets(ledger)
    if not isinstance(target, str) or target not in known:
        raise InputError(f"{target!r} is not a pipeline run in this ledger",
                         hint="start one of: " + (", ".join(known) or "(none yet)"))
    if not isinstance(params, Mapping) or len(params) > START_PARAMS:
        raise InputError("params must be an object of at most 100 name: value strings",
                         hint='send "params": {"n": "5"}')
    argv_p: list[str] = []
    for k, v in params.items():
        if not (isinstance(k, str) and k.isidentifier()) or not isinstance(v, str) \
                or len(v) > START_VALUE_CHARS or "\x00" in v:
            raise InputError(f"parameter {str(k)[:40]!r} must be a name with a text value "
                             f"of at most {START_VALUE_CHARS:,} characters",
                             hint="write values as on the command line: -p n=5")
        argv_p += ["-p", f"{k}={v}"]
    run = ledger.run(known[target])
    kind = ledger.store_kind(run)
    if kind not in ("duckdb", "postgres"):
        raise InputError(f"runs in a {kind!r} store cannot be started from another process",
                         hint="start it from the process that holds the store")
    location = ledger.location(run)
    env = {**os.environ, "LEDGERFLOW_STORE": location}      # not argv: it may hold a password
    # the CLI types and checks the parameters, without running anything
    check = subprocess.run([sys.executable, "-m", "ledgerflow", "graph", target, *argv_p],
                           capture_output=True, text=True, env=env, timeout=120,
                           stdin=subprocess.DEVNULL)
    if check.returncode != 0:
        lines = [x for x in check.stderr.splitlines() if x.strip()]
        err = next((x[len("Error: "):] for x in lines if x.startswith("Error: ")),
                   lines[-1] if lines else f"pipeline graph exited {check.returncode}")
        hint = next((x[len("Hint: "):] for x in lines if x.startswith("Hint: ")), None)
        raise InputError(err, hint=hint or "check the parameters")
    argv = [sys.executable, "-m", "ledgerflow", "run", target, *argv_p]
    proc, log = _spawn(argv, env, _log_folder(location, kind), "run", "start")
    return {"message": f"run of {target} started (pid {proc.pid}); output in {log}",
            "target": target, "params": dict(params), "pid": proc.pid, "log": str(log)}
