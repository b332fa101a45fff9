"""Approval gates: what a gate decides for the driver, and deciding requests from any process.

The requests' life cycle is :class:`~ledgerflow.states.ApprovalState`
(pending -> approved | rejected | expired). A decision is recorded through the
store (atomically: of two deciders of one request exactly one wins) and
applied by whichever driver next drives the run.

* For the driver, :class:`Gates` decides and returns data, the runner applies
  it (the pattern of :func:`ledgerflow.resume.decide`): :meth:`Gates.check`
  and :meth:`Gates.ask` say :class:`Pass`, :class:`Wait` or :class:`Refuse`,
  :meth:`Gates.poll` says which open gates were decided meanwhile.
* **One deadline rule** (:func:`decide_deadline`, applied by whichever process
  next touches the run: the driver, ``status``, ``approve``, ``resume``) and
  **one refusal rule** (:func:`refusal`): the driver fails a refused gate's
  task with it, and :func:`overlay` shows readers that same state and reason
  before a driver applied it.
* :func:`approve`, :func:`reject` and :func:`pending` are the deciding side
  (the CLI, the console, :class:`~ledgerflow.Run`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .approval import DRAFTING, Approval, Decision, summarize, who
from .errors import (
    ApprovalConflictError,
    InputError,
    NotWaitingError,
    StaleDigestError,
    TaskNotFoundError,
)
from .records import ApprovalDecided, ApprovalRequested
from .states import PENDING_APPROVAL, REFUSED, ApprovalState, TaskState, approval_transition
from .store import RunStore
from .task import MapRef, TaskRef
from .views import RunView

if TYPE_CHECKING:
    from .plan import Instance

#: A digest prefix must have at least this many hex digits.
MIN_PREFIX = 6
#: Who decides a request whose deadline passed, and why.
DEADLINE_BY = "ledgerflow (deadline)"
DEADLINE_REASON = "no decision before the deadline"

_APPROVED = ApprovalState.APPROVED.value


@dataclass(frozen=True, slots=True)
class Pass:
    """The gate is approved: the task goes on. ``record``: the decision to journal."""

    by: str
    record: ApprovalDecided | None


@dataclass(frozen=True, slots=True)
class Wait:
    """No decision yet: the task waits in ``waiting_approval`` (``reason`` of that move).
    ``record``: the request to journal (None when this digest was asked before)."""

    reason: str
    record: ApprovalRequested | None


@dataclass(frozen=True, slots=True)
class Refuse:
    """The gate was rejected or expired: the task fails with ``reason`` (see :func:`refusal`)."""

    reason: str
    record: ApprovalDecided | None


Verdict = Pass | Wait | Refuse


# -- the two rules -----------------------------------------------------------------------

def refusal(decision: Mapping[str, Any]) -> tuple[TaskState, str]:
    """What a refused request does to its task: the state and the reason (one rule for
    the driver, which moves the task, and for readers, whom :func:`overlay` shows it)."""
    return TaskState.FAILED, (f"{decision['decision']}: "
                              f"{decision.get('reason') or 'no reason given'} "
                              f"(by {decision.get('decided_by')})")


def deadline_verdict(on_timeout: str) -> ApprovalState:
    """The decision a request gets when its deadline passes."""
    return ApprovalState.EXPIRED if on_timeout == "fail" else ApprovalState.REJECTED


def decide_deadline(st: RunStore, run_id: str, task_key: str, digest: str,
                    on_timeout: str) -> dict[str, Any] | None:
    """Record the deadline's decision of a pending request; None if someone decided first."""
    verdict = approval_transition(digest, PENDING_APPROVAL, deadline_verdict(on_timeout))
    try:
        return st.decide(run_id, task_key, digest, verdict.value, DEADLINE_BY, DEADLINE_REASON)
    except ApprovalConflictError:       # decided meanwhile by someone
        return None


# -- the driver's side -------------------------------------------------------------------

class Gates:
    """The approval gates of one drive: requests, decisions, open gates (runner-owned)."""

    __slots__ = ("decided", "journaled", "latest_request", "open", "requested")

    def __init__(self) -> None:
        #: decisions by digest; requests recorded (deadline, on_timeout) by digest
        self.decided: dict[str, dict[str, Any]] = {}
        self.requested: dict[str, tuple[float | None, str]] = {}
        #: open gates by task key: (instance, digest, deadline, on_timeout)
        self.open: dict[str, tuple[Instance, str, float | None, str]] = {}
        #: digests whose decision is journaled; each task's latest request
        self.journaled: set[str] = set()
        self.latest_request: dict[str, str] = {}

    def load(self, store: RunStore, run_id: str) -> None:
        """What a prior drive recorded: its requests and decisions (a resume)."""
        for r in store.approvals(run_id):
            self.requested[r["digest"]] = (r["deadline"], r["on_timeout"])
            if r["state"] != PENDING_APPROVAL:
                self.decided[r["digest"]] = {
                    "task_key": r["task_key"], "digest": r["digest"], "decision": r["state"],
                    "decided_by": r["decided_by"], "reason": r["reason"],
                    "decided_at": r["decided_at"]}
            if r["current"]:
                self.latest_request[r["task_key"]] = r["digest"]
        self._learn(store.approval_decisions(run_id))

    def _learn(self, decisions: Iterable[dict[str, Any]]) -> None:
        for d in decisions:
            self.decided.setdefault(d["digest"], d)

    def reopen(self, inst: Instance) -> None:
        """A task restored in ``waiting_approval``: its gate stays open."""
        dg = self.latest_request.get(inst.key, "")
        deadline, on_timeout = self.requested.get(dg, (None, "fail"))
        self.open[inst.key] = (inst, dg, deadline, on_timeout)

    def check(self, inst: Instance, dg: str, gate: Approval) -> Verdict:
        """A gate on the task (``@task(approve=...)``) before its attempt."""
        dec = self.decided.get(dg)
        if dec is None:
            inputs = {u.key: u.hash or "" for u in inst.up} if inst.up else {}
            return self.ask(inst, dg, gate.action or "run", task_summary(inst), inputs, gate)
        return self._verdict(inst.key, dec)

    def ask(self, inst: Instance, dg: str, action: str, summary: str,
            inputs: dict[str, str], gate: Approval) -> Wait:
        """Open a gate: the request to record (once per digest); the task waits."""
        now = time.time()
        deadline = now + gate.timeout if gate.timeout is not None else None
        known = self.requested.get(dg)
        record = None
        if known is None:
            record = ApprovalRequested(inst.key, inst.attempt, dg, action, summary, inputs,
                                       now, deadline, gate.on_timeout, list(gate.approvers),
                                       gate.note)
            self.requested[dg] = (deadline, gate.on_timeout)
        else:
            deadline = known[0]
        self.open[inst.key] = (inst, dg, deadline, gate.on_timeout)
        return Wait(f"approval of {action!r} requested ({dg[:12]})", record)

    def ask_in_task(self, inst: Instance, request: Mapping[str, Any]) -> Wait:
        """An attempt stopped at ``context().approval(...)`` (``ApprovalNeeded.request()``)."""
        gate = Approval(timeout=request["timeout"], on_timeout=request["on_timeout"],
                        approvers=tuple(request["approvers"]), note=request["note"])
        return self.ask(inst, request["digest"], request["action"], request["summary"], {},
                        gate)

    def is_decided(self, dg: str) -> bool:
        return dg in self.decided

    def poll(self, store: RunStore, run_id: str) -> list[tuple[Instance, Pass | Refuse]]:
        """The open gates decided since (from any process), deadlines applied first."""
        self._learn(store.approval_decisions(run_id))
        now = time.time()
        out: list[tuple[Instance, Pass | Refuse]] = []
        for key, (inst, dg, deadline, on_timeout) in list(self.open.items()):
            dec = self.decided.get(dg)
            if dec is None and deadline is not None and now >= deadline:
                dec = decide_deadline(store, run_id, key, dg, on_timeout)
                if dec is None:
                    continue        # decided meanwhile: seen at the next poll
                self.decided[dg] = dec
            if dec is not None:
                out.append((inst, self._verdict(key, dec)))
        return out

    def _verdict(self, key: str, dec: dict[str, Any]) -> Pass | Refuse:
        self.open.pop(key, None)
        record = None
        if dec["digest"] not in self.journaled:
            self.journaled.add(dec["digest"])
            record = ApprovalDecided(dec["task_key"], dec["digest"], dec["decision"],
                                     dec.get("decided_by") or "", dec.get("reason") or "",
                                     float(dec.get("decided_at") or time.time()))
        if dec["decision"] == _APPROVED:
            return Pass(str(dec["decided_by"]), record)
        return Refuse(refusal(dec)[1], record)

    def decisions_for(self, key: str) -> dict[str, Decision]:
        """The decisions an attempt of task ``key`` gets (``context().approval`` reads them)."""
        if not self.decided:
            return {}
        return {dg: Decision(d["decision"], d.get("decided_by") or "", d.get("reason") or "",
                             float(d.get("decided_at") or 0), dg)
                for dg, d in self.decided.items() if d["task_key"] == key}


def task_summary(inst: Instance) -> str:
    """A readable one-line summary of what a gated task is called with."""
    node = inst.node
    names = list(inspect.signature(node.task.fn).parameters)
    shown = [f"<result of {a.key}>" if isinstance(a, (TaskRef, MapRef)) else a
             for a in node.args]
    kwargs = {k: (f"<result of {v.key}>" if isinstance(v, (TaskRef, MapRef)) else v)
              for k, v in node.kwargs.items()}
    if node.is_map:
        shown = [inst.item if inst.has_item else f"<item of {node.source.key}>"]
    return summarize(names, shown, kwargs)


# -- the readers' and deciders' side ---------------------------------------------------------

def _waiting(r: Mapping[str, Any]) -> bool:
    return r["state"] == PENDING_APPROVAL and bool(r["current"])


def apply_deadlines(st: RunStore, run_id: str) -> list[dict[str, Any]]:
    """Decide every pending request of the run whose deadline passed; return them."""
    now = time.time()
    done = []
    for r in st.approvals(run_id):
        if _waiting(r) and r["deadline"] is not None and now >= r["deadline"]:
            dec = decide_deadline(st, run_id, r["task_key"], r["digest"], r["on_timeout"])
            if dec is not None:
                done.append(dec)
    return done


def pending(st: RunStore, run_id: str) -> list[dict[str, Any]]:
    """The requests of a run that wait for a decision (deadlines applied first)."""
    apply_deadlines(st, run_id)
    return waiting_requests(st.approvals(run_id))


def waiting_requests(approvals: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The current requests among ``approvals`` rows that wait for a decision."""
    return [r for r in approvals if _waiting(r)]


def overlay(view: RunView, approvals: list[dict[str, Any]]) -> RunView:
    """Show readers what a driver will apply: a refused gate's task is ``failed`` with the
    reason the driver records (:func:`refusal`)."""
    for r in approvals:
        row = view.tasks.get(r["task_key"])
        if row is None or not r["current"] or row.state != TaskState.WAITING_APPROVAL:
            continue
        if r["state"] in REFUSED:
            state, reason = refusal({**r, "decision": r["state"]})
            row.state = state.value
            row.error = f"{reason}; applied when the run is resumed"
    return view


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
    return st.decide(run_id, task_key, req["digest"], _APPROVED, by, reason)


def reject(st: RunStore, run_id: str, task_key: str, *, reason: str,
           digest: str | None = None, by: str | None = None) -> dict[str, Any]:
    """Reject the request waiting for ``task_key``: the task fails (reason ``rejected``)."""
    if not reason:
        raise InputError("a rejection needs a reason", hint='pass --reason "..."')
    req = _request(st, run_id, task_key)
    _check_digest(req, digest, required=False)
    return st.decide(run_id, task_key, req["digest"], ApprovalState.REJECTED.value,
                     by or who(), reason)
