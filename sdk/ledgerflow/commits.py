"""The group commit of one run: the one transition applier and what observers hear after it.

A :class:`Journal` is the runner's write side. :meth:`Journal.move` and
:meth:`Journal.move_run` are the only code that applies a task or run
transition (creation, the resume reset and the restore of a prior run
included: :meth:`Journal.restore` applies :func:`ledgerflow.resume.decide`).
Records are buffered and written in one :meth:`Journal.flush` (the group
commit); observers hear of them after it returned (see the run protocol in
:mod:`ledgerflow.hookspecs`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .attempt_log import logged_calls
from .errors import LeaseLostError
from .observers import Change, Observers
from .records import (
    FORMAT_VERSION,
    AttemptEnded,
    DriverHeader,
    Notice,
    Record,
    ResultRecorded,
    RunDefined,
    RunStateChanged,
    Succeeded,
    TaskCreated,
    Transition,
)
from .resume import decide
from .states import (
    _TASK_EDGES,
    TERMINAL,
    Outcome,
    RunState,
    TaskState,
    check_restored,
    run_transition,
    transition,
)
from .store import lease_probe

if TYPE_CHECKING:
    from .executor import Completion
    from .plan import Instance
    from .store import CacheHit, Lease, RunStore
    from .views import RunView, TaskRow

log = logging.getLogger("ledgerflow")

_TERMINAL = frozenset(s.value for s in TERMINAL)
_SUCCEEDED, _PENDING = TaskState.SUCCEEDED.value, TaskState.PENDING
_PENDING_V = _PENDING.value
_LOST, _OK = Outcome.LOST.value, Outcome.OK.value
_RUNNING = TaskState.RUNNING.value
_READY_V = TaskState.READY.value


class Journal:
    """The records of one drive, buffered until the next group commit."""

    __slots__ = ("active", "buf", "changes", "durable_due", "ended", "failed", "flushed_at",
                 "hears_attempts", "lag", "lease", "lease_probe", "observed", "observers",
                 "run_id", "run_state", "seq", "store", "unheard")

    def __init__(self, store: RunStore, run_id: str, observers: Observers,
                 prior: RunView | None) -> None:
        self.store = store
        self.run_id = run_id
        self.observers = observers
        self.lease: Lease | None = None
        self.run_state: str | None = prior.state if prior else None
        self.seq = prior.max_seq if prior else 0
        self.buf: list[Record] = []
        self.changes: list[Change] = []         # told to observers after the commit
        self.ended: list[AttemptEnded] = []     # told to observers after the commit
        self.active = 0                          # tasks not yet terminal
        self.observed = observers.watching
        self.hears_attempts = observers.hears_attempts
        #: the store's optional lease-loss probe (see :meth:`check_lease`)
        self.lease_probe: Callable[[Lease], str | None] | None = lease_probe(store)
        #: the commit lag (``Settings.commit_lag``; 0: off), when the last commit was
        #: made (monotonic; none yet: the first is due, however long the machine has been
        #: up), and whether an attempt that must not lag was dispatched since
        self.lag, self.flushed_at, self.durable_due = 0.0, -math.inf, False
        #: commits a :class:`LagWriter` wrote, observers not yet told; what it raised
        self.unheard: list[list[Record]] = []
        self.failed: BaseException | None = None

    # -- the run's own records ----------------------------------------------------------
    def create(self, *, pipeline: str, target: str | None, params: dict[str, Any],
               options: dict[str, Any], submit: bool = False) -> Lease:
        """Record a new run and take its lease (nothing runs yet).

        ``submit``: record it ``submitted``, for another process to drive (the
        caller releases the lease without driving).
        """
        now = time.time()
        records: list[Record] = [
            RunDefined(self.run_id, pipeline, target, params_json(params), now,
                       json.dumps(options, sort_keys=True))]
        if not submit:
            records.append(driver_header(1))
        self.move_run(RunState.SUBMITTED if submit else RunState.RUNNING, "", records=records)
        self.lease = self.store.create_run(self.run_id, records)
        self.observers.committed(self.run_id, records, self.store)
        return self.lease

    def take_over(self, lease: Lease) -> None:
        """Continue a run whose lease ``lease`` this process now holds (resume)."""
        self.lease = lease
        records: list[Record] = [driver_header(lease.token)]
        self.move_run(RunState.RUNNING, "resumed", resume=True, records=records)
        self.store.append(lease, records)
        self.observers.committed(self.run_id, records, self.store)

    def cancel_submitted(self, lease: Lease, reason: str) -> None:
        """End a ``submitted`` run that no driver took yet: it goes ``cancelled``."""
        self.lease = lease
        self.move_run(RunState.CANCELLED, reason)
        self.flush()

    # -- the lease ----------------------------------------------------------------------
    def lost(self) -> str | None:
        """Why this driver lost its lease (None while it holds, or the store cannot say)."""
        if self.lease_probe is None or self.lease is None:
            return None
        return self.lease_probe(self.lease)

    def check_lease(self) -> None:
        """Raise LeaseLostError once the store says this driver lost its lease.

        A store may offer a cheap, local lease-loss probe (``store.lease_probe``);
        the runner polls it with its cancel check, so a fenced driver stops
        dispatching and its in-flight work is cancelled (``executor.shutdown``)
        without waiting for its next commit to be refused.
        """
        if self.lease_probe is None:
            return      # the store cannot tell (checked after every in-driver attempt)
        reason = self.lost()
        if reason is not None:
            raise LeaseLostError(f"lease lost: {reason}",
                                 hint=f"the run is driven elsewhere or resumable: "
                                 f"pipeline status {self.run_id}")

    def stop_seen(self, cancel_event: threading.Event) -> bool:
        """True once the run should stop: a cancel asked here or in the ledger (by any
        process), or a lease this driver lost."""
        if self.lost() is not None:
            return True     # a driver that lost its lease stops its work
        return cancel_event.is_set() or self.store.cancel_requested(self.run_id)

    # -- transitions --------------------------------------------------------------------
    def move_run(self, target: RunState, reason: str, *, resume: bool = False,
                 records: list[Record] | None = None) -> None:
        """Apply one run transition: check it and record it."""
        run_transition(self.run_id, self.run_state, target, resume=resume)
        self.run_state = target.value
        (self.buf if records is None else records).append(
            RunStateChanged(target.value, reason, time.time()))

    def move(self, inst: Instance, target: str, reason: str = "", *,
             resume: bool = False) -> None:
        """Apply one task transition: check it, record it, queue it for observers.

        A move right after the task's last one in the buffer is written into that
        record (its ``then_state``: format 3), not as a record of its own.
        """
        old = self._step(inst, target, reason, resume)
        seq, now, buf = self.seq, time.time(), self.buf
        last: Any = buf[-1] if buf else None
        kind = type(last)
        if (kind is Transition or kind is TaskCreated) and last.then_state is None \
                and last.seq == seq - 1 and last.task_key == inst.key:
            last.then_state, last.then_attempt, last.then_reason, last.then_ts = (
                target, inst.attempt, reason, now)
        else:
            buf.append(Transition(seq, inst.key, inst.attempt, old or None, target, reason,
                                  now))

    def _step(self, inst: Instance, target: str, reason: str, resume: bool) -> str | None:
        """Check a task transition and apply it to ``inst`` and the counts (the caller
        records it as move ``self.seq``); returns the state it left."""
        old = inst.state
        if old:
            if target not in _TASK_EDGES[old]:
                transition(inst.key, old, target, resume=resume)    # raises if illegal
        elif target != _PENDING_V:      # a creation goes to pending, nowhere else
            transition(inst.key, None, target, resume=resume)      # raises
        self.seq += 1
        inst.state = target
        if target in _TERMINAL:
            self.active -= 1
        elif old in _TERMINAL or not old:
            self.active += 1
        if self.observed:
            self.changes.append((self.run_id, inst.key, old or None, target, inst.attempt,
                                 reason))
        return old

    def create_task(self, inst: Instance, now: float) -> None:
        """Record a new task and its creation (``None -> pending``, in the same record).

        Its upstream keys are the tasks it reads from; a fan-out child with an
        item names the task whose list it was mapped over first (lineage shows
        that edge; the list is not in its fingerprint, the item is).
        """
        node = inst.node
        g = inst.group
        ups = [u.key for u in inst.up]
        if g is not None and inst.has_item and g.source is not None:
            ups.insert(0, g.source.key)
        self._step(inst, _PENDING_V, "", False)
        self.buf.append(TaskCreated(
            inst.key, node.task.name, node.key,
            None if g is None else inst.key[len(node.key):], inst.pos,
            ups, node.task.version, now, self.seq))

    def succeed(self, inst: Instance, c: Completion, *, plain: bool = False) -> None:
        """Record the result an attempt reported (its blob stored first), then its success.

        Right after the plain ``ok`` of that attempt, the three are one record
        (:class:`~ledgerflow.records.Succeeded`); ``plain``: the attempt of a running
        task ended ``ok`` with nothing else to record and no one hears of attempts (its
        ``AttemptEnded`` is not buffered first, to be replaced).
        """
        enc = c.encoded
        assert enc is not None
        if c.has_value:
            inst.value = c.value
        else:
            inst.enc = enc
        inst.hash = enc.hash
        uri = self.store.put_blob(enc)
        data = enc.data.decode() if uri is None else None
        if uri is not None and not c.has_value:
            inst.enc = None
            inst.ref = (enc.kind, None, uri)
        buf = self.buf
        a: Any = buf[-1] if buf and not plain else None
        if plain or (type(a) is AttemptEnded and inst.state == _RUNNING and a.outcome == _OK
                     and a.task_key == inst.key and a.attempt == inst.attempt
                     and not (a.error_type or a.error_message or a.traceback)):
            self._step(inst, _SUCCEEDED, "", False)
            done = Succeeded(self.seq, inst.key, inst.attempt, c.started_at, c.ended_at,
                             inst.fp, enc.hash, enc.kind, data, uri, enc.size, time.time())
            if not plain:
                buf[-1] = done
            elif buf and _carries_dispatch(done, buf[-1]):
                buf[-1] = done      # its dispatch, not written yet (the lag), is in it
            else:
                buf.append(done)
        else:
            buf.append(ResultRecorded(inst.key, inst.attempt, inst.fp, enc.hash, enc.kind,
                                      data, uri, enc.size, None))
            self.move(inst, _SUCCEEDED)
        inst.fp = None      # recorded; a retry computes it again

    def reuse(self, inst: Instance, hit: CacheHit) -> None:
        """Record a cache hit as the task's result (no attempt runs), then its success."""
        src_run, src_key, chash, kind, data, uri, size = hit
        inst.hash = chash
        inst.ref = (kind, data, uri)
        self.buf.append(ResultRecorded(inst.key, inst.attempt, inst.fp, chash, kind, data, uri,
                                       size, src_run))
        inst.fp = None
        self.move(inst, _SUCCEEDED, f"cached: same fingerprint as {src_run}/{src_key}")

    def restore(self, inst: Instance, row: TaskRow, run_folder: str | None) -> None:
        """Take a task's state from the prior drive, then apply the resume policy."""
        inst.state = check_restored(inst.key, row.state)
        if inst.state not in _TERMINAL:
            self.active += 1
        inst.attempt = row.attempts
        inst.used = row.attempts - row.budget_base
        missing = inst.state == _SUCCEEDED and row.result_uri is not None \
            and not self.store.blob_exists(row.result_uri)
        if inst.state == _SUCCEEDED and not missing:
            inst.hash = row.result_hash
            inst.ref = (row.result_kind or "json", row.result_data, row.result_uri)
            return
        decision = decide(row, inst.node.task.options.retries, result_missing=missing)
        if missing:
            self.note(inst.key, inst.attempt, "result_missing",
                      f"its result file {row.result_uri} is gone; the task runs again")
        if decision.lost:
            self.add([AttemptEnded(inst.key, inst.attempt, _LOST, row.started_at, time.time(),
                                   "", "the driving process died while the attempt ran", "")])
            if run_folder is not None:      # what it did was kept in its call log as made
                self.buf += logged_calls(run_folder, inst.key, inst.attempt)
        for target, reason in decision.moves:
            self.move(inst, target.value, reason, resume=True)
            if target == _PENDING:
                inst.used = 0

    # -- records ------------------------------------------------------------------------
    def add(self, records: list[Record]) -> None:
        """Buffer records; attempts ended are told to observers after the commit, and a
        rejected late result is logged."""
        self.buf += records
        for r in records:
            if type(r) is AttemptEnded:
                if self.hears_attempts:
                    self.ended.append(r)
            elif type(r) is Notice and r.kind == "late_result_rejected":
                log.warning("run %s task %s attempt %d: %s", self.run_id, r.task_key,
                            r.attempt, r.message)

    def note(self, key: str, attempt: int, kind: str, message: str) -> None:
        """Record a notice for an attempt (and log it)."""
        log.warning("run %s task %s attempt %d: %s", self.run_id, key, attempt, message)
        self.buf.append(Notice(key, attempt, kind, message, time.time()))

    def due(self) -> bool:
        """True if the attempts about to start need the group commit first: durable
        before start, unless the lag is on, none of them must not lag, and the last
        commit is younger than the lag (then they start on, and it commits later)."""
        return (not self.lag or self.durable_due
                or time.monotonic() - self.flushed_at >= self.lag)

    def write(self) -> None:
        """Write the buffered records (one group commit); observers hear at :meth:`flush`."""
        self.flushed_at, self.durable_due = time.monotonic(), False
        if self.buf:
            records, self.buf = self.buf, []
            assert self.lease is not None
            self.store.append(self.lease, records)
            self.unheard.append(records)

    def flush(self) -> None:
        """Write the buffered records (one group commit), then tell observers."""
        if self.failed is not None:     # a LagWriter's commit failed: the drive stops
            failed, self.failed = self.failed, None
            raise failed
        self.write()
        if self.unheard:
            unheard, self.unheard = self.unheard, []
            for records in unheard:
                self.observers.committed(self.run_id, records, self.store)
        if self.changes:
            changes, self.changes = self.changes, []
            self.observers.changed(changes)
        if self.ended:
            ended, self.ended = self.ended, []
            self.observers.ended(self.run_id, ended)


class LagWriter:
    """Writes a lagged group commit while an in-driver attempt runs on past the lag, so
    no record waits for the journal much longer than the lag (``Settings.commit_lag``),
    however long the attempt takes. It checks every half lag; the driver thread holds
    :attr:`guard` from the end of an attempt on, so the two never touch the buffer at
    once (an attempt in the driver thread does not touch it)."""

    def __init__(self, journal: Journal) -> None:
        self.j = journal
        self.guard = threading.Lock()
        self.inside = False         # the driver thread is in an attempt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ledgerflow-commit-{journal.run_id}")
        self._thread.start()

    def attempt(self, fn: Callable[..., Completion], *args: Any) -> Completion:
        """``fn(*args)``, an attempt run in the driver thread; the journal may be written
        meanwhile."""
        self.inside = True
        try:
            return fn(*args)
        finally:
            with self.guard:
                self.inside = False

    def _run(self) -> None:
        j = self.j
        while not self._stop.wait(j.lag / 2):
            if self.inside and j.buf and time.monotonic() - j.flushed_at >= j.lag:
                with self.guard:
                    if self.inside and j.buf:
                        try:
                            j.write()
                        except BaseException as exc:    # raised by the driver's next flush
                            j.failed = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _carries_dispatch(done: Succeeded, last: Record) -> bool:
    """Let ``done`` (format 4) stand for ``last`` too, if ``last`` is the dispatch of the
    same attempt right before it (``[pending ->] ready -> running``, as the runner moves
    it) that no commit wrote yet: one record a plain in-driver attempt, not two."""
    if type(last) is not Transition:
        return False
    e = last
    a = done.attempt
    if e.task_key != done.task_key:
        return False
    if e.then_state is None:
        if e.seq != done.seq - 1 or e.attempt != a or e.from_state != _READY_V \
                or e.to_state != _RUNNING or e.reason != f"attempt {a}":
            return False
        done.run_ts = e.ts
        return True
    if e.seq != done.seq - 2 or e.attempt != a - 1 or e.from_state != _PENDING_V \
            or e.to_state != _READY_V or e.reason or e.then_state != _RUNNING \
            or e.then_attempt != a or e.then_reason != f"attempt {a}":
        return False
    done.run_ts, done.ready_ts = e.then_ts, e.ts
    return True


def driver_header(token: int) -> DriverHeader:
    """The record a driver writes when it takes a lease."""
    return DriverHeader(token, os.getpid(), socket.gethostname(), time.time(), FORMAT_VERSION)


def params_json(params: dict[str, Any]) -> str:
    """Serialise pipeline parameters for the ledger (repr for odd values)."""
    return json.dumps(params, default=repr, sort_keys=True)
