"""Deciding approval requests from any process: approve and reject, checked (the digest
binds what is decided, the gate's approvers bind who decides, an edit of a tool call's
arguments is checked against its schema), then recorded by the store and announced.

The gates themselves (what waits, deadlines, the driver's verdicts) live in
:mod:`ledgerflow.gates`; this module is what ``pipeline approve`` / ``reject``, the
console and ``Run.approve`` call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .approval import DRAFTING, masked
from .edits import checked
from .errors import InputError, NotWaitingError, StaleDigestError, TaskNotFoundError
from .gates import MIN_PREFIX, apply_deadlines, notify, overlay, pending
from .identity import decider
from .states import PENDING_APPROVAL, ApprovalState
from .store import RunStore

__all__ = ["MIN_PREFIX", "apply_deadlines", "approve", "next_step", "overlay", "pending",
           "reject"]

_APPROVED = ApprovalState.APPROVED.value


def _request(st: RunStore, run_id: str, task_key: str) -> dict[str, Any]:
    view = st.get_run(run_id)
    if task_key not in view.tasks:
        if view.pipeline == DRAFTING:
            raise InputError(f"run {run_id} drafted a spec; a draft is approved by its "
                             "file, not as a task of the drafting run",
                             hint="review it (pipeline validate FILE --plan), then: "
                             "pipeline approve-draft FILE --digest PREFIX")
        raise TaskNotFoundError(run_id, task_key, view.tasks)
    waiting = [r for r in pending(st, run_id) if r["task_key"] == task_key]
    if not waiting:
        done = [r for r in st.approvals(run_id) if r["task_key"] == task_key and r["current"]]
        state = view.tasks[task_key].state
        what = (f"; its request was {done[-1]['state']} by {done[-1]['decided_by']}"
                if done and done[-1]["state"] != PENDING_APPROVAL else "")
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


def _listed(req: dict[str, Any], name: str, verb: str) -> str:
    """``name``, if the gate lists no approvers or lists it (approving and rejecting
    alike: a person the gate does not name can neither let it pass nor stop it)."""
    if req["approvers"] and name not in req["approvers"]:
        raise InputError(f"{name!r} may not {verb} {req['task_key']!r}; its approvers are: "
                         + ", ".join(req["approvers"]),
                         hint="ask one of them (a person decides as their OS user, or as a "
                         "name the approvers mapping gives them: see the README's approvals)")
    return name


def approve(st: RunStore, run_id: str, task_key: str, *, digest: str | None,
            reason: str = "", by: str | None = None,
            arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Approve the request waiting for ``task_key`` (``digest``: a prefix of its digest).

    ``by``: who decides, checked by :func:`ledgerflow.identity.decider` (default: the
    OS user's approver name; another name only where the approvers mapping allows).
    ``arguments``: what a tool call runs with instead (:func:`ledgerflow.edits.checked`)."""
    req = _request(st, run_id, task_key)
    _check_digest(req, digest, required=True)
    edit = {} if arguments is None else {"arguments": checked(req, arguments)}
    name = _listed(req, decider(by), "approve")
    return _decided(st, run_id, st.decide(run_id, task_key, req["digest"], _APPROVED, name,
                                          reason, **edit))


def reject(st: RunStore, run_id: str, task_key: str, *, reason: str,
           digest: str | None = None, by: str | None = None) -> dict[str, Any]:
    """Reject the request waiting for ``task_key``: the task fails (reason ``rejected``)."""
    if not reason:
        raise InputError("a rejection needs a reason", hint='pass --reason "..."')
    req = _request(st, run_id, task_key)
    _check_digest(req, digest, required=False)
    name = _listed(req, decider(by), "reject")
    return _decided(st, run_id, st.decide(run_id, task_key, req["digest"],
                                          ApprovalState.REJECTED.value, name, reason))


def _decided(st: RunStore, run_id: str, dec: dict[str, Any]) -> dict[str, Any]:
    notify("ledgerflow_approval_decided", run_id=run_id, decision=masked(dict(dec)))
    return {**dec, "next": next_step(st, run_id)}


def next_step(st: RunStore, run_id: str) -> str:
    """What happens to the run after a decision, as the decider should read it (``next``
    of a decision: the CLI and the console say it): a live driver (one waiting with
    ``--wait-approvals``) picks it up; otherwise the run stays as it is until resumed."""
    view = st.get_run(run_id, tasks=False)
    if view.driver_alive:
        return "its driver picks the decision up within a second"
    state = getattr(view.state, "value", view.state)
    more = len(pending(st, run_id))
    workers = " (a pipeline worker on this ledger claims it too)" \
        if getattr(st, "name", "") == "postgres" else ""
    return (f"resume it with: pipeline resume {run_id}{workers}; it stays {state} until then"
            + (f"; {more} more request(s) of this run wait: pipeline approvals {run_id}"
               if more else ""))
