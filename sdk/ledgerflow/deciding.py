"""Deciding approval requests from any process: approve, reject, deadlines, what waits.

A decision is recorded through the store (atomically: of two deciders of one
request exactly one wins) and applied by whichever driver next drives the
run. Deadlines are applied by whichever process next touches the run
(:func:`apply_deadlines`: the driver, ``status``, ``approve``, ``resume``).
"""

from __future__ import annotations

import time
from typing import Any

from .approval import APPROVED, DRAFTING, EXPIRED, REJECTED, who
from .errors import ApprovalConflictError, InputError, NotWaitingError, StaleDigestError
from .states import TaskState
from .store import RunStore
from .views import RunView

#: A digest prefix must have at least this many hex digits.
MIN_PREFIX = 6


def apply_deadlines(st: RunStore, run_id: str) -> list[dict[str, Any]]:
    """Decide every pending request of the run whose deadline passed; return them."""
    now = time.time()
    done = []
    for r in st.approvals(run_id):
        if r["state"] == "pending" and r["current"] and r["deadline"] is not None \
                and now >= r["deadline"]:
            verdict = EXPIRED if r["on_timeout"] == "fail" else REJECTED
            try:
                done.append(st.decide(run_id, r["task_key"], r["digest"], verdict,
                                      "ledgerflow (deadline)",
                                      "no decision before the deadline"))
            except ApprovalConflictError:
                continue        # someone decided it meanwhile
    return done


def pending(st: RunStore, run_id: str) -> list[dict[str, Any]]:
    """The requests of a run that wait for a decision (deadlines applied first)."""
    apply_deadlines(st, run_id)
    return [r for r in st.approvals(run_id) if r["state"] == "pending" and r["current"]]


def overlay(view: RunView, approvals: list[dict[str, Any]]) -> RunView:
    """Show decisions not yet applied by a driver: a refused gate's task reads ``failed``."""
    for r in approvals:
        row = view.tasks.get(r["task_key"])
        if row is None or not r["current"] or row.state != TaskState.WAITING_APPROVAL:
            continue
        if r["state"] in (REJECTED, EXPIRED):
            row.state = TaskState.FAILED.value
            row.error = f"{r['state']}: {r['reason'] or 'no reason given'} (by " \
                        f"{r['decided_by']}; applied when the run is resumed)"
    return view


def _request(st: RunStore, run_id: str, task_key: str) -> dict[str, Any]:
    view = st.get_run(run_id)
    if task_key not in view.tasks:
        if view.pipeline == DRAFTING:
            raise InputError(f"run {run_id} drafted a spec; a draft is approved by its "
                             "file, not as a task of the drafting run",
                             hint="review it (pipeline validate FILE --plan), then: "
                             "pipeline approve-draft FILE --digest PREFIX")
        raise InputError(f"run {run_id} has no task {task_key!r}",
                         hint=f"list what waits with: pipeline approvals {run_id}")
    waiting = [r for r in pending(st, run_id) if r["task_key"] == task_key]
    if not waiting:
        done = [r for r in st.approvals(run_id) if r["task_key"] == task_key and r["current"]]
        state = view.tasks[task_key].state
        what = (f"; its request was {done[-1]['state']} by {done[-1]['decided_by']}"
                if done and done[-1]["state"] != "pending" else "")
        raise NotWaitingError(f"task {task_key!r} of run {run_id} is not waiting for an "
                              f"approval (it is {state}{what})",
                              hint=f"list what waits with: pipeline approvals {run_id}")
    return waiting[-1]


def _check_digest(req: dict[str, Any], prefix: str | None, required: bool) -> None:
    current = req["digest"]
    if prefix is None or prefix == "":
        if required:
            raise InputError(f"approving {req['task_key']!r} needs the digest of what is "
                             "approved",
                             hint=f"check it (pipeline approvals), then --digest {current[:12]}")
        return
    if len(prefix) < MIN_PREFIX:
        raise InputError(f"digest prefix {prefix!r} is too short to be unambiguous",
                         hint=f"give at least {MIN_PREFIX} characters, e.g. --digest "
                         f"{current[:12]}")
    if not current.startswith(prefix.lower()):
        raise StaleDigestError(
            f"digest {prefix} does not match the request waiting for {req['task_key']!r}: "
            f"{current} (its arguments, inputs or payload changed)",
            hint=f"check what is asked now (pipeline approvals), then --digest {current[:12]}")


def approve(st: RunStore, run_id: str, task_key: str, *, digest: str | None,
            reason: str = "", by: str | None = None) -> dict[str, Any]:
    """Approve the request waiting for ``task_key`` (``digest``: a prefix of its digest)."""
    req = _request(st, run_id, task_key)
    _check_digest(req, digest, required=True)
    by = by or who()
    if req["approvers"] and by not in req["approvers"]:
        raise InputError(f"{by!r} may not approve {task_key!r}; its approvers are: "
                         + ", ".join(req["approvers"]),
                         hint="ask one of them, or pass --as NAME if you are one")
    return st.decide(run_id, task_key, req["digest"], APPROVED, by, reason)


def reject(st: RunStore, run_id: str, task_key: str, *, reason: str,
           digest: str | None = None, by: str | None = None) -> dict[str, Any]:
    """Reject the request waiting for ``task_key``: the task fails (reason ``rejected``)."""
    if not reason:
        raise InputError("a rejection needs a reason", hint='pass --reason "..."')
    req = _request(st, run_id, task_key)
    _check_digest(req, digest, required=False)
    return st.decide(run_id, task_key, req["digest"], REJECTED, by or who(), reason)
