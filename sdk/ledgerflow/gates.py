"""Approval gates: what a gate decides for the driver, and what waits for readers.

The requests' life cycle is :class:`~ledgerflow.states.ApprovalState`
(pending -> approved | rejected | expired). A decision is recorded through the
store (atomically: of two deciders of one request exactly one wins) and
applied by whichever driver next drives the run.

* For the driver, :class:`Gates` decides and returns data, the runner applies
  it (the pattern of :func:`ledgerflow.resume.decide`): :meth:`Gates.check`
  and :meth:`Gates.ask` say :class:`Pass`, :class:`Wait` or :class:`Refuse`,
  :meth:`Gates.poll` says which open gates were decided meanwhile.
* **One deadline rule** (:func:`decide_deadline`, applied by the first process
  that touches the run after it: the driver waiting with ``--wait-approvals``,
  ``runs``, ``status``, ``approvals``, ``approve``, ``resume``, a worker, the
  console; the store's atomic decision records it once) and **one refusal
  rule**: a refused task gate fails its task (:func:`refusal`); a decided
  in-task gate hands the decision to the code, in every drive. :func:`overlay`
  shows readers that same state before a driver applied it.
* An in-task request whose payload changes on every attempt (asked again after
  an approval of the same action that the attempt did not use) is refused,
  naming the fields that changed (:func:`~ledgerflow.approval.unstable`).
* :func:`pending` lists what waits; :func:`ledgerflow.deciding.approve` and
  ``reject`` are the deciding side (the CLI, the console, :class:`~ledgerflow.Run`);
  who decides is :func:`ledgerflow.identity.decider`'s answer. The hooks
  ``ledgerflow_approval_requested`` / ``_decided`` / ``_expired`` fire once per
  request (:func:`notify`).
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .approval import (
    ARG,
    EDIT,
    VERSION,
    Approval,
    Decision,
    Decisions,
    line,
    payload_fields,
    previous_of,
    render,
    request_doc,
    task_digest,
    unstable,
)
from .edits import spec_of
from .errors import (
    ApprovalConflictError,
)
from .records import ApprovalDecided, ApprovalRequested
from .states import (
    PENDING_APPROVAL,
    REFUSED,
    ApprovalState,
    RunState,
    TaskState,
    approval_transition,
)
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
log = logging.getLogger(__name__)


def notify(hook: str, **kwargs: Any) -> None:
    """Call an approval hook (``ledgerflow_approval_*``); what it raises is logged."""
    try:
        from .plugins import get_plugin_manager
        getattr(get_plugin_manager().hook, hook)(**kwargs)
    except Exception:
        log.exception("hook %s failed", hook)


@dataclass(frozen=True, slots=True)
class Pass:
    """The task goes on: its gate is approved, or an in-task gate was decided (either
    way: the code gets the decision). ``record``: the decision to journal; ``reason``:
    of the task's move to ``ready``."""

    by: str
    record: ApprovalDecided | None
    reason: str = ""


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
        dec = st.decide(run_id, task_key, digest, verdict.value, DEADLINE_BY, DEADLINE_REASON)
    except ApprovalConflictError:       # decided meanwhile by someone
        return None
    notify("ledgerflow_approval_expired", run_id=run_id, decision=dict(dec))
    return dec


# -- the driver's side -------------------------------------------------------------------

class Gates:
    """The approval gates of one drive: requests, decisions, open gates (runner-owned)."""

    __slots__ = ("asked", "decided", "journaled", "latest_request", "open", "requested",
                 "run_id")

    def __init__(self, run_id: str = "") -> None:
        self.run_id = run_id
        #: decisions by digest; requests recorded (deadline, on_timeout) by digest
        self.decided: dict[str, dict[str, Any]] = {}
        self.requested: dict[str, tuple[float | None, str]] = {}
        #: in-task requests by digest: (task key, action, code version, inputs)
        self.asked: dict[str, tuple[str, str, str, dict[str, str]]] = {}
        #: open gates by task key: (instance, digest, deadline, on_timeout)
        self.open: dict[str, tuple[Instance, str, float | None, str]] = {}
        #: digests whose decision is journaled; each task's latest request
        self.journaled: set[str] = set()
        self.latest_request: dict[str, str] = {}

    def load(self, store: RunStore, run_id: str) -> None:
        """What a prior drive recorded: its requests and decisions (a resume)."""
        self.run_id = self.run_id or run_id
        for r in store.approvals(run_id):
            self.requested[r["digest"]] = (r["deadline"], r["on_timeout"])
            inputs = dict(r.get("inputs") or {})
            if VERSION in inputs:
                self.asked[r["digest"]] = (r["task_key"], r["action"], inputs[VERSION], inputs)
            if r["state"] != PENDING_APPROVAL:
                self.decided[r["digest"]] = {
                    "task_key": r["task_key"], "digest": r["digest"], "decision": r["state"],
                    "decided_by": r["decided_by"], "reason": r["reason"],
                    "decided_at": r["decided_at"]}
            if r["current"]:
                self.latest_request[r["task_key"]] = r["digest"]
        self._learn(store.approval_decisions(run_id))

    def _learn(self, decisions: Iterable[dict[str, Any]]) -> None:
        for d in decisions:      # a decision's edited arguments are in the side copy only
            known = self.decided.setdefault(d["digest"], d)
            if d.get("arguments") is not None:
                known.setdefault("arguments", d["arguments"])

    def reopen(self, inst: Instance) -> None:
        """A task restored in ``waiting_approval``: its gate stays open."""
        dg = self.latest_request.get(inst.key, "")
        deadline, on_timeout = self.requested.get(dg, (None, "fail"))
        self.open[inst.key] = (inst, dg, deadline, on_timeout)

    def check(self, inst: Instance, literals: bytes, ups: Iterable[str],
              args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None) -> Verdict:
        """The gate on the task (``@task(approve=...)``) before its attempt, bound to its
        literal arguments and upstream hashes; ``args`` and ``kwargs``: the values it is
        called with (shown to the approver, masked)."""
        gate = inst.node.task.options.approve
        assert gate is not None
        dg = task_digest(self.run_id, inst.key, inst.node.task.version, literals, ups)
        dec = self.decided.get(dg)
        if dec is None:
            inputs = {u.key: u.hash or "" for u in inst.up} if inst.up else {}
            summary, values = task_summary(inst, list(args), kwargs)
            inputs.update({ARG + k: v for k, v in values.items()})
            return self.ask(inst, dg, gate.action or "run", summary, inputs, gate)
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
            notify("ledgerflow_approval_requested", run_id=self.run_id,
                   request=request_doc({**record_dict(record), "run_id": self.run_id}))
        else:
            deadline = known[0]
        self.open[inst.key] = (inst, dg, deadline, gate.on_timeout)
        return Wait(f"approval of {action!r} requested ({dg[:12]})", record)

    def ask_in_task(self, inst: Instance, request: Mapping[str, Any]) -> Wait | Refuse:
        """An attempt stopped at ``context().approval(...)`` (``ApprovalNeeded.request()``).

        Refused when the attempt was re-run after an approval of the same action (same
        code) and asked for a different payload without using that approval: a payload
        that changes on every attempt would ask forever."""
        gate = Approval(timeout=request["timeout"], on_timeout=request["on_timeout"],
                        approvers=tuple(request["approvers"]), note=request["note"])
        dg, action = request["digest"], request["action"]
        version = inst.node.task.version
        summary, fields = payload_fields(request["summary"])
        inputs = {**{ARG + k: v for k, v in fields.items()}, VERSION: version}
        if request.get("edit"):
            inputs[EDIT] = json.dumps(request["edit"], sort_keys=True)
        used = request.get("used")
        if used is not None and dg not in self.decided:
            for old, (key, act, ver, before) in self.asked.items():
                if (key, act, ver) == (inst.key, action, version) and old != dg \
                        and old not in used and self.decided.get(old, {}).get(
                            "decision") == _APPROVED:
                    return Refuse(unstable(action, before, inputs), None)
        self.asked[dg] = (inst.key, action, version, inputs)
        return self.ask(inst, dg, action, summary, inputs, gate)

    def is_decided(self, dg: str) -> bool:
        return dg in self.decided

    def poll(self, store: RunStore, run_id: str) -> list[tuple[Instance, Pass | Refuse]]:
        """The open gates decided since (from any process), deadlines applied first."""
        self.run_id = self.run_id or run_id
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
        by = str(dec.get("decided_by") or "")
        if dec["decision"] == _APPROVED:
            return Pass(by, record, f"approved by {by}")
        if dec["digest"] in self.asked:      # an in-task gate: the code gets the refusal
            return Pass(by, record, f"{dec['decision']} by {by}: the task runs again and "
                        "its approval() returns that decision")
        return Refuse(refusal(dec)[1], record)

    def decisions_for(self, key: str) -> Decisions:
        """The decisions an attempt of task ``key`` gets (``context().approval`` reads them):
        approvals and refusals alike, so the code that asked handles both, in whichever
        drive sees the decision."""
        if not self.decided:    # a run without decisions (most): one shared, never written
            return _NO_DECISIONS
        return Decisions({dg: Decision(d["decision"], d.get("decided_by") or "",
                                       d.get("reason") or "", float(d.get("decided_at") or 0),
                                       dg, d.get("arguments"))
                          for dg, d in self.decided.items() if d["task_key"] == key})


#: What an attempt of a run without decisions gets (``get`` finds nothing, so it stays empty).
_NO_DECISIONS = Decisions()


def task_summary(inst: Instance, args: list[Any] | None = None,
                 kwargs: Mapping[str, Any] | None = None) -> tuple[str, dict[str, str]]:
    """What a gated task is called with: a one-line summary and each argument rendered
    (masked, bounded). Without ``args``, upstream results show as ``<result of KEY>``."""
    node = inst.node
    names = list(inspect.signature(node.task.fn).parameters)
    if args is None or (not args and not kwargs and (node.args or node.kwargs)):
        shown: list[Any] = [f"<result of {a.key}>" if isinstance(a, (TaskRef, MapRef))
                            else a for a in node.args]
        kw = {k: (f"<result of {v.key}>" if isinstance(v, (TaskRef, MapRef)) else v)
              for k, v in node.kwargs.items()}
        if node.is_map:
            shown = [inst.item if inst.has_item else f"<item of {node.source.key}>"]
    else:
        shown, kw = list(args), dict(kwargs or {})
    values = {name: render(v, name) for name, v in zip(names, shown, strict=False)}
    values.update({k: render(v, k) for k, v in kw.items()})
    return line(values), values


def record_dict(r: ApprovalRequested) -> dict[str, Any]:
    """A request record as the store's approvals rows hold it (state pending)."""
    return {"task_key": r.task_key, "attempt": r.attempt, "digest": r.digest,
            "action": r.action, "summary": r.summary, "inputs": dict(r.inputs),
            "requested_at": r.requested_at, "deadline": r.deadline,
            "on_timeout": r.on_timeout, "approvers": list(r.approvers), "note": r.note,
            "state": PENDING_APPROVAL, "current": True}


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
    """The requests of a run that wait for a decision (deadlines applied first), each as
    recorded plus what an approver sees (:func:`~ledgerflow.approval.request_doc`:
    ``arguments``, ``changed``, ``previous``, ``editable``; ``inputs``: input hashes;
    ``edit_spec``: what may be edited, :func:`ledgerflow.edits.spec_of`)."""
    apply_deadlines(st, run_id)
    rows = st.approvals(run_id)
    by_gate: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by_gate.setdefault((r["task_key"], r["action"]), []).append(r)
    out = []
    for r in waiting_requests(rows):
        same = by_gate[(r["task_key"], r["action"])]
        doc = request_doc(r, previous_of(same, r) if len(same) > 1 else None)
        out.append({**r, **{k: doc[k] for k in ("arguments", "inputs", "changed",
                                                 "previous", "editable")},
                    "edit_spec": spec_of(r)})
    return out


def waiting_requests(approvals: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The current requests among ``approvals`` rows that wait for a decision."""
    return [r for r in approvals if _waiting(r)]


def overlay(view: RunView, approvals: list[dict[str, Any]]) -> RunView:
    """Show readers what a driver will apply: a refused task gate's task is ``failed``
    with the reason the driver records (:func:`refusal`); a decided in-task gate's task
    is ``ready`` (it runs again and gets the decision); a waiting run with nothing left
    to decide reads ``failed`` if all its gates were refused."""
    again = False
    for r in approvals:
        row = view.tasks.get(r["task_key"])
        if row is None or not r["current"] or row.state != TaskState.WAITING_APPROVAL:
            continue
        if r["state"] in REFUSED and VERSION in (r.get("inputs") or {}):
            row.state = TaskState.READY.value
            row.error = (f"{r['state']} by {r['decided_by']}: the task runs again and its "
                         "approval() returns that decision when the run is resumed")
            again = True
        elif r["state"] in REFUSED:
            state, reason = refusal({**r, "decision": r["state"]})
            row.state = state.value
            row.error = f"{reason}; applied when the run is resumed"
    if view.state == RunState.WAITING and view.tasks and not any(
            t.state == TaskState.WAITING_APPROVAL for t in view.tasks.values()):
        if again:
            view.reason = "every request is decided; continue it with: pipeline resume " \
                + view.run_id
        else:   # a run waits only when nothing but its gates can move: the driver fails it
            view.state = RunState.FAILED.value
            view.reason = "its approval requests were refused or expired; applied when " \
                "the run is resumed"
    return view


def listed(st: RunStore, views: list[RunView]) -> list[RunView]:
    """A listing of runs as readers see them: a ``waiting`` run whose requests all
    expired or were refused reads as :func:`overlay` shows it (deadlines applied)."""
    for v in views:
        if v.state == RunState.WAITING:
            full = st.get_run(v.run_id)
            apply_deadlines(st, v.run_id)
            overlay(full, st.approvals(v.run_id))
            v.state, v.reason = full.state, full.reason
            if v.tasks:         # the counts the listing shows, as overlaid
                v.tasks = full.tasks
            if v.task_counts is not None:
                v.task_counts = full.counts()
    return views

