"""The task, run and approval state machines: the state names, one table each, one check.

No I/O lives here, and the state names exist only here: every other module
uses these enums and sets. :func:`transition` and :func:`run_transition`
decide whether an edge is legal; ``Journal.move`` and ``Journal.move_run``
(:mod:`ledgerflow.commits`, the runner's write side) are the only code that
applies one (creation, the resume reset and the restore of a prior run included).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Final

from .errors import InvalidTransitionError


class TaskState(str, Enum):
    """Where a task is in its life. Values are persisted: never rename one."""

    PENDING = "pending"
    READY = "ready"
    WAITING_APPROVAL = "waiting_approval"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UPSTREAM_FAILED = "upstream_failed"

    def __str__(self) -> str:
        return self.value


class RunState(str, Enum):
    """Where a run is in its life. Values are persisted: never rename one.

    ``submitted``: recorded by ``pipeline submit``, waiting for a driver
    (``pipeline worker`` or ``pipeline resume`` takes it over). ``waiting``:
    nothing can run until a person decides an open approval gate; its driver
    stopped (exit code 3) and a resume continues it once decided.
    """

    SUBMITTED = "submitted"
    RUNNING = "running"
    WAITING = "waiting"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


class Outcome(str, Enum):
    """How one attempt ended. Values are persisted: never rename one."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    LOST = "lost"
    #: the attempt stopped at an in-task approval gate; it runs again once decided
    WAITING = "waiting"

    def __str__(self) -> str:
        return self.value


class ApprovalState(str, Enum):
    """Where an approval request is in its life. Values are persisted: never rename one.

    A request is ``pending`` until one decision is recorded for its digest
    (through the store, so of two deciders exactly one wins): ``approved``,
    ``rejected``, or ``expired`` (its deadline passed with ``on_timeout="fail"``;
    with ``"reject"`` it is ``rejected``). The gate's task follows it:
    ``waiting_approval -> ready`` when approved, ``-> failed`` otherwise.
    """

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"

    def __str__(self) -> str:
        return self.value


_A = ApprovalState
#: Legal decisions of a request: one, from ``pending``; a decided request stays decided.
APPROVAL_TRANSITIONS: Final[Mapping[ApprovalState, frozenset[ApprovalState]]] = {
    _A.PENDING: frozenset({_A.APPROVED, _A.REJECTED, _A.EXPIRED}),
    _A.APPROVED: frozenset(),
    _A.REJECTED: frozenset(),
    _A.EXPIRED: frozenset(),
}
#: Decisions that refuse the gate (its task fails with the decision as its reason).
REFUSED: Final[frozenset[str]] = frozenset({_A.REJECTED.value, _A.EXPIRED.value})
#: The persisted value of a request that waits for a decision.
PENDING_APPROVAL: Final = _A.PENDING.value


def approval_transition(digest: str, current: str, target: str) -> ApprovalState:
    """Return ``target`` if a request may be decided ``current -> target``, else raise.

    Example:
        >>> approval_transition("d", "pending", "approved")
        <ApprovalState.APPROVED: 'approved'>
    """
    ok = current in _APPROVAL_VALUES and target in _APPROVAL_VALUES and \
        ApprovalState(target) in APPROVAL_TRANSITIONS[ApprovalState(current)]
    if not ok:
        raise InvalidTransitionError(
            f"approval request {digest[:12]!r} cannot go from {current!r} to {target!r}")
    return ApprovalState(target)


_T = TaskState
#: Legal task transitions within one drive. ``ready -> succeeded`` is a cache
#: hit: a committed result with the same fingerprint is reused, no attempt runs;
#: ``ready -> failed``: its upstream results could not be loaded (no attempt ran),
#: or its approval was rejected or expired. ``ready -> waiting_approval``: a gate
#: on the task asks first; ``running -> waiting_approval``: a gate inside it did.
TASK_TRANSITIONS: Final[Mapping[TaskState, frozenset[TaskState]]] = {
    _T.PENDING: frozenset({_T.READY, _T.CANCELLED, _T.UPSTREAM_FAILED}),
    _T.READY: frozenset({_T.RUNNING, _T.SUCCEEDED, _T.CANCELLED, _T.FAILED,
                         _T.WAITING_APPROVAL}),
    _T.WAITING_APPROVAL: frozenset({_T.READY, _T.FAILED, _T.CANCELLED}),
    _T.RUNNING: frozenset({_T.SUCCEEDED, _T.RETRY_WAIT, _T.FAILED, _T.CANCELLING,
                           _T.WAITING_APPROVAL}),
    _T.RETRY_WAIT: frozenset({_T.READY, _T.FAILED, _T.CANCELLED}),
    _T.CANCELLING: frozenset({_T.CANCELLED, _T.SUCCEEDED, _T.FAILED}),
    _T.SUCCEEDED: frozenset(),
    _T.FAILED: frozenset(),
    _T.CANCELLED: frozenset(),
    _T.UPSTREAM_FAILED: frozenset(),
}

#: The only edges a resume adds: a task that did not succeed goes back to
#: ``pending`` with a fresh attempt budget; so does a success whose result file
#: is gone (deleted by hand), since nothing can read it any more.
TASK_RESUME_TRANSITIONS: Final[Mapping[TaskState, frozenset[TaskState]]] = {
    _T.SUCCEEDED: frozenset({_T.PENDING}),
    _T.FAILED: frozenset({_T.PENDING}),
    _T.CANCELLED: frozenset({_T.PENDING}),
    _T.UPSTREAM_FAILED: frozenset({_T.PENDING}),
}

#: A task that will not change again in this drive.
TERMINAL: Final[frozenset[TaskState]] = frozenset(
    s for s, targets in TASK_TRANSITIONS.items() if not targets)
#: Terminal but not a success (a resume resets these).
FAILED_LIKE: Final[frozenset[TaskState]] = frozenset(TASK_RESUME_TRANSITIONS) - {_T.SUCCEEDED}
#: A task whose attempt may still be executing somewhere.
IN_FLIGHT: Final[frozenset[TaskState]] = frozenset({_T.RUNNING, _T.CANCELLING})
#: A task a cancel moves straight to ``cancelled`` (nothing of it runs).
NOT_STARTED: Final[frozenset[TaskState]] = frozenset({_T.PENDING, _T.READY, _T.RETRY_WAIT,
                                                      _T.WAITING_APPROVAL})

_R = RunState
#: Legal run transitions within one drive.
RUN_TRANSITIONS: Final[Mapping[RunState, frozenset[RunState]]] = {
    _R.SUBMITTED: frozenset({_R.CANCELLED}),
    _R.RUNNING: frozenset({_R.SUCCEEDED, _R.FAILED, _R.CANCELLING, _R.CANCELLED,
                           _R.WAITING}),
    # a waiting run that is cancelled, or whose gate expires, with no driver left
    _R.WAITING: frozenset({_R.CANCELLED, _R.FAILED}),
    _R.CANCELLING: frozenset({_R.CANCELLED, _R.FAILED, _R.SUCCEEDED}),
    _R.SUCCEEDED: frozenset(),
    _R.FAILED: frozenset(),
    _R.CANCELLED: frozenset(),
}

#: What a new driver may do when it takes a run over (``pipeline resume``): a
#: run whose driver died is still ``running`` or ``cancelling`` in the ledger.
RUN_RESUME_TRANSITIONS: Final[Mapping[RunState, frozenset[RunState]]] = {
    _R.SUBMITTED: frozenset({_R.RUNNING}),
    _R.RUNNING: frozenset({_R.RUNNING}),
    _R.WAITING: frozenset({_R.RUNNING}),
    _R.CANCELLING: frozenset({_R.RUNNING}),
    _R.FAILED: frozenset({_R.RUNNING}),
    _R.CANCELLED: frozenset({_R.RUNNING}),
}

#: A run that has ended.
RUN_TERMINAL: Final[frozenset[RunState]] = frozenset(
    s for s, targets in RUN_TRANSITIONS.items() if not targets)
#: A run that may still have a driver.
RUN_ACTIVE: Final[frozenset[RunState]] = frozenset(RunState) - RUN_TERMINAL

# Plain-string lookups for the hot path (values are the persisted strings).
_TASK_EDGES: Final[dict[str, frozenset[str]]] = {
    s.value: frozenset(t.value for t in targets) for s, targets in TASK_TRANSITIONS.items()}
_TASK_RESUME_EDGES: Final[dict[str, frozenset[str]]] = {
    s.value: frozenset(t.value for t in targets)
    for s, targets in TASK_RESUME_TRANSITIONS.items()}
_RUN_EDGES: Final[dict[str, frozenset[str]]] = {
    s.value: frozenset(t.value for t in targets) for s, targets in RUN_TRANSITIONS.items()}
_RUN_RESUME_EDGES: Final[dict[str, frozenset[str]]] = {
    s.value: frozenset(t.value for t in targets)
    for s, targets in RUN_RESUME_TRANSITIONS.items()}
_TASK_VALUES: Final[frozenset[str]] = frozenset(s.value for s in TaskState)
_RUN_VALUES: Final[frozenset[str]] = frozenset(s.value for s in RunState)
_APPROVAL_VALUES: Final[frozenset[str]] = frozenset(s.value for s in ApprovalState)


def transition(task_key: str, current: str | None, target: str, *,
               resume: bool = False) -> TaskState:
    """Return ``target`` if a task may go ``current -> target``, else raise.

    ``current=None`` is the creation of a task (only to ``pending``);
    ``resume=True`` also allows :data:`TASK_RESUME_TRANSITIONS`.

    Raises:
        InvalidTransitionError: the edge is not in the tables.

    Example:
        >>> transition("a", "pending", "ready")
        <TaskState.READY: 'ready'>
    """
    if current is None:
        ok = target == _T.PENDING
    else:
        ok = target in _TASK_EDGES[current] or (
            resume and target in _TASK_RESUME_EDGES.get(current, ()))
    if not ok:
        raise InvalidTransitionError(
            f"task {task_key!r} cannot go from {current!r} to {target!r}")
    return TaskState(target)


def check_restored(task_key: str, state: str) -> str:
    """Return the state a prior drive left a task in (its value), if it is a known one."""
    if state not in _TASK_VALUES:
        raise InvalidTransitionError(f"task {task_key!r} has unknown state {state!r}")
    return state


def run_transition(run_id: str, current: str | None, target: str, *,
                   resume: bool = False) -> RunState:
    """Return ``target`` if a run may go ``current -> target``, else raise.

    ``current=None`` is the creation of a run (to ``running``, or ``submitted``
    for a run recorded without a driver);
    ``resume=True`` is a takeover (:data:`RUN_RESUME_TRANSITIONS`).

    Example:
        >>> run_transition("r", "failed", "running", resume=True)
        <RunState.RUNNING: 'running'>
    """
    if current is None:
        ok = target in (_R.RUNNING, _R.SUBMITTED) and not resume
    elif current not in _RUN_VALUES:
        ok = False
    else:
        edges = _RUN_RESUME_EDGES.get(current, frozenset()) if resume else _RUN_EDGES[current]
        ok = target in edges
    if not ok:
        how = "on resume " if resume else ""
        raise InvalidTransitionError(
            f"run {run_id!r} cannot go {how}from {current!r} to {target!r}")
    return RunState(target)


def is_terminal(state: str) -> bool:
    """Return True when a task in ``state`` will not change again in this drive."""
    return not _TASK_EDGES[state]


def mermaid() -> str:
    """Render the task state machine as a Mermaid state diagram."""
    lines = ["stateDiagram-v2", "    [*] --> pending"]
    for src, targets in TASK_TRANSITIONS.items():
        for dst in sorted(targets, key=lambda s: s.value):
            lines.append(f"    {src.value} --> {dst.value}")
        if not targets:
            lines.append(f"    {src.value} --> [*]")
    return "\n".join(lines)
