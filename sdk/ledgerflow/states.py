"""The task and run state machines: one table each, one function to check.

No I/O lives here. :func:`transition` is the only place that decides whether
an edge is legal; the runner is the only place that applies one.
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
    """Where a run is in its life."""

    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


class Outcome(str, Enum):
    """How one attempt ended."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    LOST = "lost"

    def __str__(self) -> str:
        return self.value


_T = TaskState
#: Legal task transitions. ``ready -> succeeded`` is a cache hit: a committed
#: result with the same fingerprint is reused and no attempt runs.
TASK_TRANSITIONS: Final[Mapping[TaskState, frozenset[TaskState]]] = {
    _T.PENDING: frozenset({_T.READY, _T.CANCELLED, _T.UPSTREAM_FAILED}),
    _T.READY: frozenset({_T.RUNNING, _T.SUCCEEDED, _T.CANCELLED}),
    _T.RUNNING: frozenset({_T.SUCCEEDED, _T.RETRY_WAIT, _T.FAILED, _T.CANCELLING}),
    _T.RETRY_WAIT: frozenset({_T.READY, _T.FAILED, _T.CANCELLED}),
    _T.CANCELLING: frozenset({_T.CANCELLED, _T.SUCCEEDED, _T.FAILED}),
    _T.SUCCEEDED: frozenset(),
    _T.FAILED: frozenset(),
    _T.CANCELLED: frozenset(),
    _T.UPSTREAM_FAILED: frozenset(),
}

#: Terminal states a resume may send back to ``pending`` (a fresh attempt budget).
RESETTABLE: Final[frozenset[TaskState]] = frozenset(
    {_T.FAILED, _T.CANCELLED, _T.UPSTREAM_FAILED})

TERMINAL: Final[frozenset[TaskState]] = frozenset(
    s for s, targets in TASK_TRANSITIONS.items() if not targets)

_R = RunState
RUN_TRANSITIONS: Final[Mapping[RunState, frozenset[RunState]]] = {
    _R.RUNNING: frozenset({_R.SUCCEEDED, _R.FAILED, _R.CANCELLING, _R.CANCELLED}),
    _R.CANCELLING: frozenset({_R.CANCELLED, _R.FAILED, _R.SUCCEEDED}),
    _R.SUCCEEDED: frozenset(),
    _R.FAILED: frozenset({_R.RUNNING}),      # resume
    _R.CANCELLED: frozenset({_R.RUNNING}),   # resume
}

# Plain-string lookups for the hot path (values are the persisted strings).
_TASK_EDGES: Final[dict[str, frozenset[str]]] = {
    s.value: frozenset(t.value for t in targets) for s, targets in TASK_TRANSITIONS.items()}
_RUN_EDGES: Final[dict[str, frozenset[str]]] = {
    s.value: frozenset(t.value for t in targets) for s, targets in RUN_TRANSITIONS.items()}


def transition(task_key: str, current: str, target: str) -> str:
    """Return ``target`` if ``current -> target`` is legal for a task, else raise.

    Raises:
        InvalidTransitionError: the edge is not in :data:`TASK_TRANSITIONS`.

    Example:
        >>> transition("a", "pending", "ready")
        'ready'
    """
    if target in _TASK_EDGES[current]:
        return target
    raise InvalidTransitionError(
        f"task {task_key!r} cannot go from {current!r} to {target!r}")


def reset_for_resume(task_key: str, current: str) -> str:
    """Return ``pending`` for a task a resume may retry, else raise."""
    if current in RESETTABLE:
        return _T.PENDING.value
    raise InvalidTransitionError(f"task {task_key!r} in state {current!r} cannot be reset")


def run_transition(run_id: str, current: str, target: str) -> str:
    """Return ``target`` if a run may go ``current -> target``, else raise."""
    if target in _RUN_EDGES[current]:
        return target
    raise InvalidTransitionError(f"run {run_id!r} cannot go from {current!r} to {target!r}")


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
