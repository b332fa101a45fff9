"""Completion policy: what an attempt's end does to its task, as data the runner applies.

In the manner of Dagster's ``mark_*`` handlers beside its active execution:
these functions look at an attempt's :class:`~ledgerflow.executor.Completion`
(or its timeout) and the task's options and return a :class:`Move` and the
records to journal; they change nothing. :class:`~ledgerflow.runner.Runner`
applies the move through its one transition applier, schedules the retry,
and unlocks or fails what depends on the task.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .attempt_log import call_records
from .records import ArtifactRecorded, AttemptEnded, LogRecorded, Notice, Record, StepRecorded
from .states import Outcome, RunState, TaskState

if TYPE_CHECKING:
    from .executor import Completion
    from .task import TaskOptions

_OK, _ERROR, _TIMEOUT = Outcome.OK.value, Outcome.ERROR.value, Outcome.TIMEOUT.value
_CANCELLED, _LOST, _WAITING = (Outcome.CANCELLED.value, Outcome.LOST.value,
                               Outcome.WAITING.value)
_STOPPED = frozenset({_CANCELLED, _LOST})
_SUCCEEDED, _FAILED = TaskState.SUCCEEDED.value, TaskState.FAILED.value
_RETRY_WAIT, _CANCELLED_T = TaskState.RETRY_WAIT.value, TaskState.CANCELLED.value
_WAITING_APPROVAL = TaskState.WAITING_APPROVAL.value


@dataclass(slots=True)
class Move:
    """What the runner does to a task whose attempt ended.

    ``target``: the task's next state. ``retry_wait`` comes with ``retry_in``
    (seconds until it is ``ready`` again); ``failed`` with ``downstream``
    (False while the run cancels: what depends on it is cancelled already);
    ``succeeded`` means "record the result, then unlock"; ``waiting_approval``
    means "open the gate the attempt stopped at".
    """

    target: str
    reason: str = ""
    retry_in: float | None = None
    downstream: bool = True


#: The move of every success (shared: moves are read, never changed).
_SUCCEED = Move(_SUCCEEDED)


def retry_or_fail(opts: TaskOptions, used: int, reason: str, exc: BaseException | None,
                  rand: random.Random) -> Move:
    """A running attempt failed (or timed out): retry after the backoff, or fail for good.

    Only running attempts get here: a cancel moves every running task to
    ``cancelling`` first, and :func:`settle` settles those itself.
    """
    if opts.retryable(exc) and used <= opts.retries:
        delay = opts.delay(used, rand.random())
        return Move(_RETRY_WAIT, f"{reason}; retry in {delay:.3g}s", retry_in=delay)
    return Move(_FAILED, reason if opts.retryable(exc) else f"{reason} (not retryable)")


def timed_out(key: str, attempt: int, limit: float, started_at: float | None,
              ended_at: float, message: str) -> AttemptEnded:
    """The record of an attempt that gave no result within ``limit`` seconds."""
    return AttemptEnded(key, attempt, _TIMEOUT, started_at, ended_at, "TimeoutError", message,
                        "")


def ran_late(state: str, opts: TaskOptions, c: Completion) -> bool:
    """True if a running task's success arrived after its timeout (e.g. inline, where no
    timer could fire): the attempt timed out and its result is rejected, not applied."""
    limit = opts.timeout
    return limit is not None and c.outcome == _OK and c.ended_at - c.started_at > limit \
        and state == TaskState.RUNNING


def late_records(key: str, attempt: int, limit: float, c: Completion) -> list[Record]:
    """What is journaled for a success that :func:`ran_late` (its output is kept)."""
    out: list[Record] = [LogRecorded(key, attempt, "output", c.log, c.log_dropped)] \
        if c.log else []
    return [*out, timed_out(key, attempt, limit, c.started_at, c.ended_at,
                            f"no result within {limit:g}s"),
            Notice(key, attempt, "late_result_rejected",
                   f"result arrived after {c.ended_at - c.started_at:.3g}s, past the "
                   f"{limit:g}s timeout; rejected, not applied", time.time())]


def reported(key: str, attempt: int, c: Completion) -> list[Record]:
    """What an attempt's report puts in the journal, whatever its outcome: how it ended,
    its output, calls, notices, steps and lineage."""
    ended = AttemptEnded(key, attempt, c.outcome, c.started_at, c.ended_at, c.error_type,
                         c.error_message, c.traceback)
    if c.bare:
        return [ended]          # the common case, kept cheap (one per task of a big run)
    out: list[Record] = []
    if c.log:
        out.append(LogRecorded(key, attempt, "output", c.log, c.log_dropped))
    out.append(ended)
    out += spent(key, attempt, c)
    out += [StepRecorded(key, attempt, name, kind, data, step_hash)
            for name, kind, data, step_hash in c.steps]
    out += [ArtifactRecorded(key, attempt, direction, uri, chash, attrs)
            for direction, uri, chash, attrs in c.lineage]
    return out


def spent(key: str, attempt: int, c: Completion) -> list[Record]:
    """The model calls, tool calls and notices an attempt reported (kept even when its
    result is rejected: what it spent is real all the same)."""
    if not (c.model_calls or c.tool_calls or c.notices):
        return []
    return call_records(key, attempt, c.model_calls, c.tool_calls,
                        [{"kind": k, "message": m, "ts": t} for k, m, t in c.notices])


def settle(state: str, opts: TaskOptions, used: int, c: Completion,
           rand: random.Random) -> Move:
    """The move of a task in ``state`` (running or cancelling) whose attempt reported ``c``."""
    if c.outcome == _OK:
        return _SUCCEED
    if c.outcome == _WAITING and c.approval is not None and state == TaskState.RUNNING:
        return Move(_WAITING_APPROVAL)
    if state == TaskState.CANCELLING:
        if c.outcome in _STOPPED:
            return Move(_CANCELLED_T, "executor confirmed it stopped")
        return Move(_FAILED, f"{c.error_type}: {c.error_message}", downstream=False)
    if c.outcome == _CANCELLED:
        return retry_or_fail(opts, used, "attempt stopped itself (cancelled)", None, rand)
    reason = (f"{c.error_type}: {c.error_message}" if c.outcome == _ERROR
              else f"attempt {c.outcome}: {c.error_message}")
    return retry_or_fail(opts, used, reason, c.error, rand)


def run_end(cancel_reason: str | None, failed: int, cancelled: int) -> tuple[RunState, str]:
    """The final state of a run that stopped driving, and its reason.

    ``cancel_reason``: why the run was cancelled (None if it was not); a cancel
    that ``fail_fast`` started ends ``failed``.
    """
    if cancel_reason is not None:
        reason = cancel_reason or "cancelled"
        return (RunState.FAILED if reason.startswith("fail_fast") else RunState.CANCELLED,
                reason)
    if failed or cancelled:
        return RunState.FAILED, f"{failed} task(s) did not succeed"
    return RunState.SUCCEEDED, ""
