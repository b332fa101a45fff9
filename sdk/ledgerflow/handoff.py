"""Attempts handed to an executor: made into Jobs, started after their commit, reported.

:class:`Handoff` is the part of :class:`~ledgerflow.runner.Runner` that
deals with attempts that run outside the driver thread (in-driver attempts
need none of it: :mod:`ledgerflow.here`): the :class:`~ledgerflow.executor.Job`
of each, its start once its ``running`` move is committed, its report
(from any thread) and the timeout the runner times itself. What a report
does to its task is the runner's ``_settle``, the same for both kinds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import outcomes
from .executor import Completion, Executor, Job, not_started
from .states import Outcome, TaskState

if TYPE_CHECKING:
    import random

    from .attempt_log import StepResults
    from .commits import Journal
    from .gates import Gates
    from .inflight import Jobs, Timers
    from .observers import Observers
    from .plan import Instance
    from .records import Record

log = logging.getLogger("ledgerflow")

_RUNNING = TaskState.RUNNING.value
_CANCELLED_O = Outcome.CANCELLED.value


class Handoff:
    """The runner's hand-off of attempts to its executor (see the module docstring)."""

    run_id: str
    executor: Executor
    observers: Observers
    jobs: Jobs
    timers: Timers
    own_timers: bool
    starting: list[Job]
    inbox: deque[Completion]
    wake: threading.Event
    _driver: int
    j: Journal
    echo: bool
    gates: Gates
    steps: StepResults
    ledger_folder: str | None
    run_folder: str | None
    rand: random.Random
    _move: Callable[..., None]
    _note: Callable[[str, int, str, str], None]
    _journal: Callable[[list[Record]], None]
    #: the runner's: apply an ended attempt's report to its task, and a completion move
    _settle: Callable[[Instance, Completion], None]
    _apply: Callable[[Instance, outcomes.Move], None]

    def _hand_off(self, inst: Instance, args: tuple[Any, ...], kwargs: dict[str, Any],
                  reason: str) -> None:
        """Move ``inst`` to ``running`` as a new Job, started after the commit."""
        node, opts = inst.node, inst.node.task.options
        job = Job.of_attempt(self.jobs.next_id(), self.run_id, inst.key, inst.attempt,
                             node.task, args, kwargs, opts.timeout, node.task.name, self.echo,
                             node.task.version, self.gates.decisions_for(inst.key),
                             self.steps.for_attempt(inst.key, inst.attempt),
                             self.ledger_folder, self.run_folder)
        inst.job = job
        self.jobs.add(job.id, inst)
        if opts.durable_start:
            self.j.durable_due = True
        self._move(inst, _RUNNING, reason)
        if opts.timeout is not None and self.own_timers:
            self.timers.add(opts.timeout, "timeout", job.id)
        self.starting.append(job)

    def _start_job(self, job: Job) -> None:
        """Hand a committed ``running`` attempt to the executor."""
        inst = self.jobs.get(job.id)
        if inst is None:
            return      # timed out before it could start
        if inst.state != _RUNNING:      # cancelled before it could start: nothing ran
            self._on_complete(Completion(job.id, _CANCELLED_O, has_value=False))
            return
        if self.observers.carrier_hook is not None:
            job.carrier = self.observers.carrier(self.run_id, job.task_key, job.attempt)
        try:
            self.executor.submit(job)
        except Exception as exc:  # executor refused (e.g. unpicklable function)
            self._on_complete(not_started(job.id, exc))

    def _on_complete(self, c: Completion) -> None:
        self.inbox.append(c)
        if threading.get_ident() != self._driver:   # inline reports need no wake-up
            self.wake.set()

    def _drain(self) -> None:
        inbox = self.inbox
        while inbox:
            self._complete(inbox.popleft())

    def _complete(self, c: Completion) -> None:
        """Apply an attempt's report: journal what it did, then move its task."""
        inst = self.jobs.finish(c.job_id, c.outcome)
        if inst is None:
            self._stray(c)
            return
        inst.job = None
        self._settle(inst, c)

    def _stray(self, c: Completion) -> None:
        """A report for no running attempt: late after a timeout, a duplicate, or unknown."""
        found = self.jobs.stray(c)
        if found is None:
            log.warning("run %s: report for unknown job %d ignored", self.run_id, c.job_id)
            return
        self._note(*found)
        if found[2] == "late_result_rejected":      # what it spent is real all the same
            self.j.buf += outcomes.spent(found[0], found[1], c)

    def _timeout(self, job_id: int) -> None:
        inst = self.jobs.get(job_id)
        if inst is None or inst.state != _RUNNING:
            return
        self.jobs.abandon(job_id, inst)
        opts = inst.node.task.options
        limit = opts.timeout
        assert limit is not None
        self._journal([outcomes.timed_out(inst.key, inst.attempt, limit, None, time.time(),
                                          f"no result within {limit:g}s; attempt abandoned")])
        try:
            self.executor.cancel(job_id, reason="timeout")
        except Exception:
            log.exception("executor.cancel failed")
        self._apply(inst, outcomes.retry_or_fail(
            opts, inst.used, f"attempt {inst.attempt} timed out after {limit:g}s", None,
            self.rand))
