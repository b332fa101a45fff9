"""Drive one run: dispatch ready tasks, apply every transition, commit in groups.

The :class:`Runner` applies every state transition through its write side,
:class:`~ledgerflow.commits.Journal` (``move`` for tasks, ``move_run`` for
the run: creation, the resume reset and the restore of a prior run included),
the one applier. Its collaborators decide and return data, and it applies:
:mod:`ledgerflow.resume` (a prior row), :mod:`ledgerflow.caching` (a cache
hit), :mod:`ledgerflow.gates` (approval gates), :mod:`ledgerflow.outcomes`
(an attempt's end); :mod:`ledgerflow.observers` hears of each commit. An
attempt runs either here, in the driver thread, called by the runner itself
(:mod:`ledgerflow.here`), or handed to the executor as a Job
(:mod:`ledgerflow.handoff`); its report is applied the same way. The order of
commits, hooks and task starts (the run protocol) is documented once, at the
top of :mod:`ledgerflow.hookspecs`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Mapping
from functools import partial

from . import outcomes
from ._gc import quiet_gc
from .attempt_log import StepResults
from .caching import Cache
from .commits import Journal, LagWriter
from .config import Settings
from .errors import InvalidTransitionError
from .executor import Completion, Executor, Job, queue_ahead, runs_in_driver
from .executor import inline_when_alone as _inline_when_alone
from .executor import timeout_from_start as _from_start
from .frontier import unread_of
from .gates import Gates, Pass, Refuse, Verdict, Wait
from .graph import Graph
from .handoff import Handoff
from .here import Here, attempt_here
from .inflight import Jobs, Timers
from .observers import Observers
from .plan import Instance, Plan, resolver
from .states import NOT_STARTED, TERMINAL, Outcome, RunState, TaskState
from .store import CacheHit, Lease, RunStore, reading, worker_folders
from .views import RunView

log = logging.getLogger("ledgerflow")

_T = TaskState
_PENDING, _READY, _RUNNING = _T.PENDING.value, _T.READY.value, _T.RUNNING.value
_RETRY_WAIT, _CANCELLING = _T.RETRY_WAIT.value, _T.CANCELLING.value
_SUCCEEDED, _FAILED, _CANCELLED = _T.SUCCEEDED.value, _T.FAILED.value, _T.CANCELLED.value
_UPSTREAM_FAILED, _WAITING_APPROVAL = _T.UPSTREAM_FAILED.value, _T.WAITING_APPROVAL.value
_OK, _ERROR, _CANCELLED_O = Outcome.OK.value, Outcome.ERROR.value, Outcome.CANCELLED.value
_TERMINAL = frozenset(s.value for s in TERMINAL)
_NOT_STARTED = frozenset(s.value for s in NOT_STARTED)

#: A group commit is flushed at this many records (else a fan-out commits once, at the end).
COMMIT_RECORDS = 4096


class Runner(Handoff):
    """The driver loop of one run (see the module docstring)."""

    def __init__(self, *, graph: Graph, store: RunStore, executor: Executor,
                 settings: Settings, run_id: str, prior: RunView | None = None,
                 cache: Mapping[str, CacheHit] | None = None, observers: Observers | None = None,
                 cancel_event: threading.Event | None = None) -> None:
        self.graph, self.store, self.executor = graph, store, executor
        self.settings, self.run_id, self.prior = settings, run_id, prior
        self.cache = Cache(cache if cache is not None else {}, store)
        self.observers = observers if observers is not None else Observers()
        #: the write side: the one transition applier and the group commit
        self.j = j = Journal(store, run_id, self.observers, prior)
        self._move, self._move_run, self._note = j.move, j.move_run, j.note
        self._journal, self._flush = j.add, j.flush
        #: the run's own records: create it, take it over (resume), cancel it unstarted
        self.create, self.take_over, self.cancel_submitted = (
            j.create, j.take_over, j.cancel_submitted)
        self.cancel_event = cancel_event or threading.Event()
        #: a cancel request (here or from any process), or a lease this driver lost
        self._cancel_seen = partial(j.stop_seen, self.cancel_event)
        self.plan = Plan(graph)
        #: a frontier resume's kept successes, their rows read when a task needs them
        self.unread = unread_of(prior, store, lambda i, row: j.restore(i, row, self.run_folder))
        self._resolve = resolver(self.plan, store.read_blob,
                                 self.unread.fill if self.unread else None)
        self.starting: list[Job] = []          # handed to the executor after the commit
        self.ready: deque[Instance] = deque()
        self.inbox: deque[Completion] = deque()
        self.wake = threading.Event()
        self.jobs = Jobs()
        self.running = self.jobs.running        # job id -> task, of attempts in flight
        self.timers = Timers()
        self.cancelling, self.cancel_reason = False, ""
        self.cancel_deadline: float | None = None
        self.failed_tasks = self.cancelled_tasks = 0
        self.rand, self.next_poll = random.Random(), 0.0
        self._driver = threading.get_ident()
        self.in_driver = runs_in_driver(executor)
        self.workers = 1 if self.in_driver else settings.workers
        self.window = self.workers      # with the executor's queue_ahead (set by drive)
        self.inline_when_alone = _inline_when_alone(executor)
        self.own_timers = not _from_start(executor)  # else the executor times jobs
        self.echo, self.wait_approvals = settings.logs, settings.wait_approvals
        self.gates = Gates(run_id)  # approval gates: what they decide, the runner applies
        folders: tuple[str | None, str | None] = worker_folders(store, run_id) or (None, None)
        self.ledger_folder, self.run_folder = folders
        self.steps = StepResults(self.run_folder)
        #: what the attempts the runner calls itself, Job-less, share (ledgerflow.here)
        self.here = Here(run_id, self._cancel_seen, self.gates, self.steps, folders, self.echo)
        # the commit lag: in-driver attempts of a first drive only
        j.lag = settings.commit_lag if self.in_driver and prior is None else 0.0

    #: the observer hooks someone implements, or None (tests read these)
    hook_records = property(lambda self: self.observers.records)
    hook_carrier = property(lambda self: self.observers.carrier_hook)

    @property
    def lease(self) -> Lease | None:
        """The lease this driver holds (None before ``create`` or ``take_over``)."""
        return self.j.lease

    # -- commits ------------------------------------------------------------------------
    def _commit(self) -> None:
        """Flush (unless the commit may lag), then hand the attempts dispatched
        meanwhile to the executor."""
        if not self.starting or self.j.due():
            self._flush()
        if self.starting:
            jobs, self.starting = self.starting, []
            for job in jobs:
                self._start_job(job)

    def _release(self, ready: list[Instance]) -> None:
        for r in ready:
            if r.state == _PENDING:
                self._move(r, _READY)
                self.ready.append(r)

    # -- set-up -------------------------------------------------------------------------
    def _adopt(self, created: list[Instance]) -> None:
        """Register new instances: record them, restore prior state, link them."""
        prior = self.prior.tasks if self.prior else {}
        now = time.time()
        restored: list[Instance] = []
        for inst in created:
            if len(self.j.buf) >= COMMIT_RECORDS:
                # many new tasks: their records are written as they come (not one 15 MB
                # commit), so a crash meanwhile leaves a consistent prefix
                self._flush()
            row = prior.get(inst.key)
            if row is None:
                if self.unread is not None and self.unread.adopt(inst):
                    restored.append(inst)       # kept by a frontier resume
                    continue
                self.j.create_task(inst, now)
            else:
                self.j.restore(inst, row, self.run_folder)
                if inst.state == _SUCCEEDED:
                    restored.append(inst)
                    continue
                if inst.state == _WAITING_APPROVAL:      # its gate stays open
                    self.gates.reopen(inst)
                    continue
            failed_up = self.plan.link(inst)
            if inst.state == _READY:
                self.ready.append(inst)
            elif failed_up is not None:
                self._move(inst, _UPSTREAM_FAILED, f"upstream {failed_up} did not succeed")
                self.failed_tasks += 1
                self._fail_downstream(inst)
            elif inst.waiting == 0:
                self._move(inst, _READY)
                self.ready.append(inst)
        for inst in restored:
            if inst.feeds or inst.group is not None:
                # a success kept from before still expands fan-outs and counts in its group
                ready, more = self.plan.succeeded(inst, self._resolve)
                self._adopt(more)
                self._release(ready)

    # -- driving ------------------------------------------------------------------------
    def drive(self) -> str:
        """Run until every task is terminal; return the run's final state."""
        if self.lease is None:
            raise InvalidTransitionError(f"run {self.run_id} is driven without a lease")
        self._driver = threading.get_ident()
        self.executor.start(workers=self.workers, on_complete=self._on_complete)
        self.lag_writer: LagWriter | None = LagWriter(self.j) if self.j.lag else None
        with quiet_gc():
            try:
                if self.prior is not None and self.prior.signals is not False:
                    with reading(self.store):   # what a prior drive recorded
                        self.gates.load(self.store, self.run_id)
                        self.steps.load(self.store.steps(self.run_id))
                self._adopt(self.plan.instantiate())
                return self._loop()
            finally:
                if self.lag_writer is not None:
                    self.lag_writer.stop()
                self.executor.shutdown()

    def _poll_cancel(self) -> None:
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + 0.1
            self.j.check_lease()
            if not self.cancelling and self._cancel_seen():
                self._start_cancel("cancel requested")
            elif self.gates.open and not self.cancelling:
                self._poll_gates()

    def _loop(self) -> str:
        workers = self.workers
        self.window = workers + queue_ahead(self.executor)
        while True:
            self._poll_cancel()
            while self.ready and not self.cancelling and (len(self.running) < workers
                                                          or self._ahead()):
                inst = self.ready.popleft()
                if inst.state == _READY:
                    self._dispatch(inst)
                if len(self.j.buf) >= COMMIT_RECORDS:
                    self._flush()       # bound the group commit (and the journal line)
                self._poll_cancel()     # attempts may run here: the loop goes on
            self._commit()
            self._drain()
            if self.ready and not self.cancelling and (len(self.running) < workers or self._ahead()):
                continue
            if self.j.active <= 0 and len(self.running) == 0 and not self.ready:
                break
            if self.gates.open and not self.wait_approvals and not self.cancelling \
                    and len(self.running) == 0 and not self.ready and not self.timers.retries_due():
                self._poll_gates()          # a decision may be there already
                if not self.ready and self.gates.open:
                    return self._finish_waiting()
                continue
            if self.cancelling and len(self.running) == 0:
                break
            if self.cancelling and self.cancel_deadline is not None \
                    and time.monotonic() > self.cancel_deadline:
                for inst in list(self.jobs.running.values()):
                    self._note(inst.key, inst.attempt, "cancel_unconfirmed",
                               "executor did not confirm cancellation in time; "
                               "task left in 'cancelling'")
                break
            self._wait()
            self._drain()
            self._fire_timers()
        return self._finish()

    def _ahead(self) -> bool:
        """With every worker busy: may the next ready task queue ahead (Executor.queue_ahead)?"""
        timed = self.ready[0].node.task.options.timeout is not None and self.own_timers
        return len(self.running) < self.window and not timed

    def _wait(self) -> None:
        if self.inbox:
            return
        if self.j.buf and self.j.lag:
            self._flush()       # a lagged commit does not wait
        timeout = self.timers.wait_at_most(0.1)
        self.wake.clear()
        if not self.inbox:
            self.wake.wait(timeout)

    def _dispatch(self, inst: Instance) -> None:
        """A cache hit, or an attempt moved to ``running``: run here once its start is
        committed (the commit may lag), or handed off after the next commit."""
        node = inst.node
        opts = node.task.options
        if self.unread is not None and self.unread.insts:
            self.unread.fill_for(inst, self.ready)      # its upstreams' rows, one read
        try:
            args, kwargs = self.plan.arguments(inst, self._resolve)
        except Exception as exc:
            self._give_up(inst, f"could not load upstream results: {exc}")
            return
        ups = [u.hash or "" for u in inst.up] if inst.up else ()
        inst.fp, literals = self.cache.fingerprint(self.plan, inst, args, kwargs, ups)
        rejected = ""
        if opts.cache:
            hit, rejected = self.cache.lookup(inst, inst.fp, args, kwargs)
            if hit is not None:
                self.j.reuse(inst, hit)
                self._unlock(inst)
                return
        if opts.approve is not None and not self._apply_gate(
                inst, self.gates.check(inst, literals, ups, args, kwargs)):
            return      # it waits, or failed
        inst.attempt += 1
        inst.used += 1
        if self.in_driver or (self.inline_when_alone and opts.timeout is None
                              and not self.running and not self.ready):
            # run here and now (ledgerflow.here), once its start is committed
            self._move(inst, _RUNNING, f"attempt {inst.attempt}{rejected}")
            if opts.durable_start or self.j.due():
                self._flush()
            self._here(inst, args, kwargs)
            return
        self._hand_off(inst, args, kwargs, f"attempt {inst.attempt}{rejected}")

    def _here(self, inst: Instance, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        """An in-driver attempt, run now (:mod:`ledgerflow.here`); its report applied."""
        carrier = None if self.observers.carrier_hook is None else self.observers.carrier(
            self.run_id, inst.key, inst.attempt)
        c = attempt_here(self.here, inst, args, kwargs, carrier, self.lag_writer)
        self.j.check_lease()
        if c.outcome == _CANCELLED_O and not self.cancelling and self._cancel_seen():
            self._start_cancel("cancel requested")   # running -> cancelling first
        self._settle(inst, c)

    # -- approval gates -------------------------------------------------------------------
    def _apply_gate(self, inst: Instance, verdict: Verdict) -> bool:
        """Apply what a gate decided (see :mod:`ledgerflow.gates`); True if it passed."""
        if verdict.record is not None:
            self.j.buf.append(verdict.record)
        if isinstance(verdict, Wait):
            self._move(inst, _WAITING_APPROVAL, verdict.reason)
            return False
        if isinstance(verdict, Refuse):
            self._give_up(inst, verdict.reason)
            return False
        return True

    def _poll_gates(self) -> None:
        """Apply decisions (from any process) and deadlines to the open gates."""
        for inst, verdict in self.gates.poll(self.store, self.run_id):
            if self._apply_gate(inst, verdict) and isinstance(verdict, Pass):
                self._move(inst, _READY, verdict.reason or f"approved by {verdict.by}")
                self.ready.append(inst)

    def _finish_waiting(self) -> str:
        """Nothing can run until a person decides: stop driving, the run ``waiting``."""
        self._move_run(RunState.WAITING, f"{len(self.gates.open)} approval(s) pending")
        self._commit()
        return RunState.WAITING.value

    def _fire_timers(self) -> None:
        for kind, payload in self.timers.due():
            if kind == "timeout":
                self._timeout(payload)
            elif kind == "retry":
                inst = payload
                if inst.state == _RETRY_WAIT and not self.cancelling:
                    self._move(inst, _READY, "retry delay over")
                    self.ready.append(inst)

    def _settle(self, inst: Instance, c: Completion) -> None:
        """Journal what an ended attempt of ``inst`` did, then move the task."""
        opts = inst.node.task.options
        if c.outcome == _OK and inst.state == _RUNNING and opts.timeout is None \
                and not self.j.hears_attempts and c.bare:
            self.j.succeed(inst, c, plain=True)     # the common case, in one record
            self._unlock(inst)
            return
        if outcomes.ran_late(inst.state, opts, c):
            assert opts.timeout is not None
            self._journal(outcomes.late_records(inst.key, inst.attempt, opts.timeout, c))
            self._apply(inst, outcomes.retry_or_fail(
                opts, inst.used, f"attempt {inst.attempt} timed out after {opts.timeout:g}s",
                None, self.rand))
            return
        self._journal(outcomes.reported(inst.key, inst.attempt, c))
        self.steps.reported(inst.key, c.steps)
        self._apply(inst, outcomes.settle(inst.state, opts, inst.used, c, self.rand), c)

    def _apply(self, inst: Instance, move: outcomes.Move, c: Completion | None = None) -> None:
        """Apply a move of the completion policy (:mod:`ledgerflow.outcomes`)."""
        target = move.target
        if target == _SUCCEEDED:
            assert c is not None
            self.j.succeed(inst, c)
            self._unlock(inst)
        elif target == _RETRY_WAIT:
            assert move.retry_in is not None
            self._move(inst, _RETRY_WAIT, move.reason)
            self.timers.add(move.retry_in, "retry", inst)
        elif target == _WAITING_APPROVAL:
            assert c is not None and c.approval is not None
            inst.used -= 1                  # waiting at a gate uses no attempt of the budget
            self._apply_gate(inst, self.gates.ask_in_task(inst, c.approval))
            if self.gates.is_decided(c.approval["digest"]):     # decided already: apply it now
                self._poll_gates()
        elif target == _FAILED and move.downstream:
            self._give_up(inst, move.reason)
        else:       # settled while the run cancels: its dependents are cancelled already
            self._move(inst, target, move.reason)
            if target == _FAILED:
                self.failed_tasks += 1
            else:
                self.cancelled_tasks += 1
            self.plan.failed(inst)

    def _unlock(self, inst: Instance) -> None:
        """Release what waited for ``inst`` (it starts only after the next commit)."""
        ready, created = self.plan.succeeded(inst, self._resolve)
        if created:
            self._adopt(created)
        if ready:
            self._release(ready)

    def _give_up(self, inst: Instance, reason: str) -> None:
        self._move(inst, _FAILED, reason)
        self.failed_tasks += 1
        self._fail_downstream(inst)
        if self.settings.fail_fast and not self.cancelling:
            self._start_cancel(f"fail_fast: task {inst.key} failed")

    def _fail_downstream(self, inst: Instance) -> None:
        for d in self.plan.failed(inst):
            if d.state == _PENDING:
                self._move(d, _UPSTREAM_FAILED, f"upstream {inst.key} did not succeed")
                self.failed_tasks += 1

    def _start_cancel(self, reason: str) -> None:
        self.cancelling = True
        self.cancel_reason = reason
        self.cancel_deadline = time.monotonic() + float(
            self.settings.options.get("cancel_grace", 30))
        self._move_run(RunState.CANCELLING, reason)
        for inst in list(self.plan.insts.values()):
            st = inst.state
            if st in _NOT_STARTED:
                self._move(inst, _CANCELLED, reason)
                self.cancelled_tasks += 1
            elif st == _RUNNING:
                self._move(inst, _CANCELLING, reason)
                if inst.job is None:
                    continue        # an in-driver attempt (ledgerflow.here): it ended
                try:
                    self.executor.cancel(inst.job.id, reason="cancel")
                except Exception:
                    log.exception("executor.cancel failed")
        self.ready.clear()
        self._commit()

    def _finish(self) -> str:
        if not self.cancelling:   # the completion invariant (Dagster's ActiveExecution)
            stuck = [i.key for i in self.plan.insts.values() if i.state not in _TERMINAL]
            if stuck:
                raise InvalidTransitionError(
                    f"run {self.run_id} stopped with {len(stuck)} unfinished task(s), "
                    f"e.g. {stuck[:5]}")
        state, reason = outcomes.run_end(self.cancel_reason if self.cancelling else None,
                                         self.failed_tasks, self.cancelled_tasks)
        self._move_run(state, reason)
        self._commit()
        return state.value
