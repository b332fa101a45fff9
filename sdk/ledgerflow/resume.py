"""What a resume does with each task a prior drive left behind (no I/O).

:func:`decide` is the one policy: ``resume`` (the runner applies it) and
``resume --plan`` (which only shows it) both call it. As in Dagster's
re-execution from failure: a success is kept; an attempt that was running
when its driver died is *lost* (recorded, then retried within the task's
budget); a task that did not succeed is reset with a fresh budget; a task
that had not started simply runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .states import FAILED_LIKE, IN_FLIGHT, TaskState
from .views import TaskRow

_T = TaskState


class Action(str, Enum):
    """What happens to a task on resume (shown by ``resume --plan``)."""

    REUSE = "reuse"
    RERUN = "rerun"
    RUN = "run"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Decision:
    """The resume policy's answer for one task.

    ``moves`` are the transitions to apply in order after the task's state is
    restored (``resume=True`` edges included); ``lost`` asks for an attempt
    record with outcome ``lost`` first.
    """

    action: Action
    why: str
    lost: bool = False
    moves: tuple[tuple[TaskState, str], ...] = ()


def decide(row: TaskRow, retries: int | None = None, *,
           result_missing: bool = False) -> Decision:
    """The resume decision for ``row``; ``retries`` is the task's option (None: unknown).

    ``result_missing``: the success's result file is gone, so it runs again.

    Example:
        >>> decide(TaskRow("a", state="failed")).action
        <Action.RERUN: 'rerun'>
    """
    state = row.state
    if state == _T.SUCCEEDED and result_missing:
        return Decision(Action.RERUN, f"its result file {row.result_uri} is gone",
                        moves=((_T.PENDING, "resume: result file missing"),))
    if state == _T.SUCCEEDED:
        return Decision(Action.REUSE, "cached result" if row.cached_from else "succeeded")
    reset = (_T.PENDING, "resume: reset with a fresh attempt budget")
    if state in IN_FLIGHT:
        why = (f"attempt {row.attempts} was {state} when the driver stopped: "
               "recorded as lost")
        if state == _T.CANCELLING:
            return Decision(Action.RERUN, why, lost=True, moves=(
                (_T.CANCELLED, "driver died while cancelling (attempt lost)"), reset))
        used = row.attempts - row.budget_base
        if retries is None or used <= retries:
            return Decision(Action.RERUN, why, lost=True, moves=(
                (_T.RETRY_WAIT, "attempt lost: driver died"), (_T.READY, "resume")))
        # no reason on the hop through failed: the lost attempt is the task's error until
        # an attempt of this resume ends (a reason here would stay its error after a
        # success: the SQL fold keeps a failed transition's reason when the same batch
        # ends in an ok attempt)
        return Decision(Action.RERUN, why, lost=True, moves=(
            (_T.FAILED, ""), (_T.PENDING, "resume: attempt lost with no retries left (driver "
                              "died): reset with a fresh attempt budget")))
    if state in FAILED_LIKE:
        return Decision(Action.RERUN, f"was {state}: reset with a fresh attempt budget",
                        moves=(reset,))
    if state == _T.RETRY_WAIT:
        return Decision(Action.RUN, f"was {state}", moves=((_T.READY, "resume"),))
    return Decision(Action.RUN, f"was {state}")
