"""Drive one run: dispatch ready tasks, record every transition, commit in groups.

The :class:`Runner` is the only code that applies a state transition
(:meth:`Runner._move`), and the user-code error boundary. It keeps all
run state in memory and hands the store records in group commits; a
task's dependents are released only after the commit holding its success
returned (*durable before unlock*).
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ._gc import quiet_gc
from .config import Settings
from .errors import InvalidTransitionError, PipelineError
from .executor import Completion, Executor, Job, execute
from .graph import Graph
from .keys import fingerprint_base, finish_fingerprint
from .results import decode
from .scheduler import _UNSET, Inst, Plan
from .states import _TASK_EDGES, reset_for_resume, transition
from .store import Lease, RunStore, RunView

log = logging.getLogger("ledgerflow")

_FAILED_LIKE = ("failed", "cancelled", "upstream_failed")
_TERMINAL = frozenset((*_FAILED_LIKE, "succeeded"))
#: A group commit is flushed once it holds this many records, even while more
#: tasks are ready (an inline fan-out would otherwise commit once at the end).
COMMIT_RECORDS = 4096


class Runner:
    """The driver loop of one run (see module docstring)."""

    def __init__(self, *, graph: Graph, store: RunStore, executor: Executor,
                 settings: Settings, run_id: str, lease: Lease, prior: RunView | None,
                 cache: dict[str, tuple[Any, ...]] | None = None,
                 hook_changed: Callable[..., Any] | None = None,
                 cancel_event: threading.Event | None = None,
                 on_change: Callable[[str, str, str], None] | None = None) -> None:
        self.graph = graph
        self.store = store
        self.executor = executor
        self.settings = settings
        self.run_id = run_id
        self.lease = lease
        self.prior = prior
        self.cache = cache or {}
        self.hook_changed = hook_changed
        self.on_change = on_change
        self.observed = hook_changed is not None or on_change is not None
        self.cancel_event = cancel_event or threading.Event()
        self.plan = Plan(graph)
        self.buf: list[tuple[Any, ...]] = []
        self.seq = prior.max_seq if prior else 0
        self.ready: deque[Inst] = deque()
        self.unlock: list[Inst] = []
        self.inbox: deque[Completion] = deque()
        self.wake = threading.Event()
        self.jobs: dict[int, Inst] = {}
        self.timed_out: dict[int, tuple[str, int]] = {}     # job id -> (task, attempt)
        self.finished: dict[int, Inst] = {}                 # job id -> its task
        self.timers: list[tuple[float, int, str, Any]] = []
        self.next_job = 0
        self.inflight = 0
        self.active = 0              # tasks not yet terminal
        self.cancelling = False
        self.cancel_deadline: float | None = None
        self.failed_tasks = 0
        self.cancelled_tasks = 0
        self.rand = random.Random()
        self.next_poll = 0.0
        self.fp_base: dict[Any, Any] = {}        # task -> its fingerprint's fixed part
        self._driver = threading.get_ident()
        # an executor may let a lone task run in the driver thread: nothing else could
        # run meanwhile, so the thread hand-off would only add latency
        self.inline_when_alone = bool(getattr(executor, "inline_when_alone", False))

    # -- records ------------------------------------------------------------------------
    def _move(self, inst: Inst, target: str, reason: str = "") -> None:
        """Apply one task transition: check it, record it, tell observers."""
        old = inst.state
        if old and target not in _TASK_EDGES[old]:
            transition(inst.key, old, target)      # raises InvalidTransitionError
        self.seq += 1
        self.buf.append(("E", self.seq, inst.key, inst.attempt, old or None, target, reason,
                         time.time()))
        inst.state = target
        if target in _TERMINAL:
            self.active -= 1
        if self.observed:
            self._notify(inst, old, target, reason)

    def _notify(self, inst: Inst, old: str, new: str, reason: str) -> None:
        if self.hook_changed is not None:
            try:
                self.hook_changed(run_id=self.run_id, task_key=inst.key, old=old or None,
                                  new=new, attempt=inst.attempt, reason=reason)
            except Exception:  # observers must never break a run
                log.exception("ledgerflow_task_state_changed hook failed")
        if self.on_change is not None:
            try:
                self.on_change(inst.key, old, new)
            except Exception:  # a progress display must never break a run
                log.exception("progress callback failed")

    def _release(self, ready: list[Inst]) -> None:
        for r in ready:
            if r.state == "pending":
                self._move(r, "ready")
                self.ready.append(r)

    def _note(self, key: str, attempt: int, kind: str, message: str) -> None:
        log.warning("run %s task %s attempt %d: %s", self.run_id, key, attempt, message)
        self.buf.append(("N", key, attempt, kind, message, time.time()))

    def _flush(self) -> None:
        """Write the buffered records (no unlocking: see :meth:`_commit`)."""
        records, self.buf = self.buf, []
        self.store.append(self.lease, records)

    def _commit(self) -> None:
        if self.buf:
            self._flush()
        if self.unlock:
            done, self.unlock = self.unlock, []
            for inst in done:
                ready, created = self.plan.succeeded(inst, self._resolve)
                if created:
                    self._adopt(created)
                if ready:
                    self._release(ready)

    # -- set-up -------------------------------------------------------------------------
    def _adopt(self, created: list[Inst]) -> None:
        """Register new instances: record them, restore prior state, link them."""
        prior = self.prior.tasks if self.prior else {}
        now = time.time()
        restored: list[Inst] = []
        buf = self.buf
        for inst in created:
            if len(buf) >= COMMIT_RECORDS:
                # creating many tasks: write their records as they come (a creation
                # unlocks nothing), so 100,000 new tasks are not one 15 MB commit
                self._flush()
                buf = self.buf
            row = prior.get(inst.key)
            if row is None:
                self.active += 1
                self.buf.append(("T", inst.key, inst.node.task.name, inst.node.key,
                                 None if inst.group is None else inst.key[len(inst.node.key):],
                                 inst.pos, [getattr(u, "key", "") for u in inst.up],
                                 inst.node.task.version, now))
                self._move(inst, "pending", "")
            else:
                self._restore(inst, row)
                if inst.state == "succeeded":
                    restored.append(inst)
                    continue
            failed_up = self.plan.link(inst)
            if inst.state == "ready":
                self.ready.append(inst)
            elif failed_up is not None:
                self._move(inst, "upstream_failed", f"upstream {failed_up} did not succeed")
                self.failed_tasks += 1
                self._doom(inst)
            elif inst.waiting == 0:
                self._move(inst, "ready")
                self.ready.append(inst)
        for inst in restored:
            if inst.feeds or inst.group is not None:
                # a success kept from before still expands fan-outs and counts in its group
                ready, more = self.plan.succeeded(inst, self._resolve)
                self._adopt(more)
                self._release(ready)

    def _restore(self, inst: Inst, row: Any) -> None:
        """Bring a task known to the ledger to succeeded, pending or ready."""
        inst.state = row.state
        if row.state not in _FAILED_LIKE and row.state != "succeeded":
            self.active += 1
        inst.attempt = row.attempts
        inst.used = row.attempts - row.budget_base
        if row.state == "succeeded":
            inst.hash = row.result_hash
            inst.ref = (row.result_kind, row.result_data, row.result_uri)
            return
        if row.state in ("running", "cancelling"):
            self.buf.append(("A", inst.key, inst.attempt, "lost", row.started_at, time.time(),
                             "", "the driving process died while the attempt ran", ""))
            if row.state == "cancelling":
                self._move(inst, "cancelled", "driver died while cancelling (attempt lost)")
            elif inst.used <= inst.node.task.options.retries:
                self._move(inst, "retry_wait", "attempt lost: driver died")
            else:
                self._move(inst, "failed", "attempt lost: driver died, no retries left")
        if inst.state in _FAILED_LIKE:
            self._reset(inst)
        elif inst.state == "retry_wait":
            self._move(inst, "ready", "resume")

    def _reset(self, inst: Inst) -> None:
        """Send a failed, cancelled or upstream_failed task back to pending (resume)."""
        old = inst.state
        reset_for_resume(inst.key, old)
        self.seq += 1
        self.buf.append(("E", self.seq, inst.key, inst.attempt, old, "pending",
                         "resume: reset with a fresh attempt budget", time.time()))
        inst.state = "pending"
        inst.used = 0
        self.active += 1
        if self.observed:
            self._notify(inst, old, "pending", "resume")

    # -- driving ------------------------------------------------------------------------
    def drive(self) -> str:
        """Run until every task is terminal; return the run's final state."""
        self._driver = threading.get_ident()
        self.executor.start(workers=self.settings.workers, on_complete=self._on_complete)
        with quiet_gc():
            try:
                self._adopt(self.plan.instantiate())
                self._commit()
                return self._loop()
            finally:
                self.executor.shutdown()

    def _loop(self) -> str:
        workers = self.settings.workers
        while True:
            now = time.monotonic()
            if now >= self.next_poll:
                self.next_poll = now + 0.1
                if not self.cancelling and (self.cancel_event.is_set()
                                            or self.store.cancel_requested(self.run_id)):
                    self._start_cancel("cancel requested")
            while self.ready and self.inflight < workers and not self.cancelling:
                inst = self.ready.popleft()
                if inst.state == "ready":
                    self._dispatch(inst)
                if self.inbox:
                    self._drain()
                if len(self.buf) >= COMMIT_RECORDS:
                    self._commit()       # bound the group commit (and the journal line)
            self._commit()
            if self.ready and self.inflight < workers and not self.cancelling:
                continue
            if self.active <= 0 and self.inflight == 0 and not self.ready:
                break
            if self.cancelling and self.inflight == 0:
                break
            if self.cancelling and self.cancel_deadline is not None \
                    and time.monotonic() > self.cancel_deadline:
                for inst in list(self.jobs.values()):
                    self._note(inst.key, inst.attempt, "cancel_unconfirmed",
                               "executor did not confirm cancellation in time; "
                               "task left in 'cancelling'")
                break
            self._wait()
            self._drain()
            self._fire_timers()
        return self._finish()

    def _wait(self) -> None:
        if self.inbox:
            return
        timeout = 0.1
        if self.timers:
            timeout = min(timeout, max(0.0, self.timers[0][0] - time.monotonic()))
        self.wake.clear()
        if not self.inbox:
            self.wake.wait(timeout)

    def _on_complete(self, c: Completion) -> None:
        self.inbox.append(c)
        if threading.get_ident() != self._driver:   # inline reports need no wake-up
            self.wake.set()

    def _drain(self) -> None:
        inbox = self.inbox
        while inbox:
            self._complete(inbox.popleft())

    def _resolve(self, thing: Any) -> Any:
        if not isinstance(thing, Inst):
            return self.plan.group_value(thing, self._resolve)
        if thing.value is not _UNSET:
            return thing.value
        if thing.enc is not None:
            value = decode(thing.enc.kind, thing.enc.data)
        elif thing.ref is not None:
            kind, data, uri = thing.ref
            value = self.store.read_blob(kind, data, uri)
        else:
            raise PipelineError(f"result of task {thing.key!r} is not available",
                                hint="resume the run so the task runs again")
        thing.value = value
        return value

    def _dispatch(self, inst: Inst) -> None:
        node = inst.node
        opts = node.task.options
        try:
            args, kwargs = self.plan.arguments(inst, self._resolve)
        except Exception as exc:
            self._give_up(inst, f"could not load upstream results: {exc}")
            return
        ups = [u.hash or "" for u in inst.up] if inst.up else ()
        base = self.fp_base.get(node.task)
        if base is None:
            base = self.fp_base[node.task] = fingerprint_base(node.task.name, node.task.version)
        inst.fp = finish_fingerprint(base, self.plan.literal_bytes(inst), ups)
        rejected = ""
        if opts.cache:
            hit = self.cache.get(inst.fp)
            if hit is not None:
                src_run, src_key, chash, kind, data, uri, size = hit
                if opts.verify is not None:
                    rejected = self._verify(opts.verify, inst, hit, args, kwargs)
                if not rejected:
                    inst.hash = chash
                    inst.ref = (kind, data, uri)
                    self.buf.append(("R", inst.key, inst.attempt, inst.fp, chash, kind, data,
                                     uri, size, src_run))
                    inst.fp = None
                    self._move(inst, "succeeded",
                               f"cached: same fingerprint as {src_run}/{src_key}")
                    self.unlock.append(inst)
                    return
        inst.attempt += 1
        inst.used += 1
        self.next_job += 1
        job = Job(self.next_job, self.run_id, inst.key, inst.attempt, node.task, args,
                  kwargs, "", opts.timeout, node.task.name)   # idempotency key: lazily
        inst.job = job
        self.jobs[job.id] = inst
        self.inflight += 1
        self._move(inst, "running", f"attempt {inst.attempt}{rejected}")
        if opts.timeout is not None:
            self._timer(time.monotonic() + opts.timeout, "timeout", job.id)
        elif self.inline_when_alone and self.inflight == 1 and not self.ready \
                and not self.unlock:
            # commit "running" first: other processes must see what is running
            records, self.buf = self.buf, []
            self.store.append(self.lease, records)
            c = execute(job, self._cancel_seen)
            if not self.cancelling and self._cancel_seen():
                self._start_cancel("cancel requested")   # running -> cancelling first
            self._on_complete(c)
            return
        try:
            self.executor.submit(job)
        except Exception as exc:  # executor refused (e.g. unpicklable function)
            self._on_complete(Completion(job.id, "error", error=exc,
                                         error_type=type(exc).__name__,
                                         error_message=f"executor could not start it: {exc}",
                                         started_at=time.time(), ended_at=time.time(),
                                         has_value=False))

    def _verify(self, verify: Callable[..., object], inst: Inst, hit: tuple[Any, ...],
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Check a cache hit of a task with ``verify=``; return why it was rejected, or "".

        Runs in the driver, with the cached result and the task's resolved
        arguments. Only True accepts; False or an exception rejects (the task
        then runs, and the reason lands in the ``running`` transition).
        """
        src_run, src_key, _, kind, data, uri, _ = hit
        where = f"{src_run}/{src_key}"
        try:
            value = self.store.read_blob(kind, data, uri)
            ok = verify(value, *args, **kwargs)
        except Exception as exc:  # user code: a failing check means "not verified"
            return f"; cache hit rejected by verify: {type(exc).__name__}: {exc} ({where})"
        if ok is True:
            inst.value = value      # read once: dependents use it as it is
            return ""
        name = getattr(verify, "__qualname__", repr(verify))
        return f"; cache hit rejected by verify: {name} returned {ok!r} ({where})"

    def _cancel_seen(self) -> bool:
        return self.cancel_event.is_set() or self.store.cancel_requested(self.run_id)

    def _timer(self, when: float, kind: str, payload: Any) -> None:
        self.next_job += 1
        heapq.heappush(self.timers, (when, self.next_job, kind, payload))

    def _fire_timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, _, kind, payload = heapq.heappop(self.timers)
            if kind == "timeout":
                self._timeout(payload)
            elif kind == "retry":
                inst = payload
                if inst.state == "retry_wait" and not self.cancelling:
                    self._move(inst, "ready", "retry delay over")
                    self.ready.append(inst)

    def _timeout(self, job_id: int) -> None:
        inst = self.jobs.pop(job_id, None)
        if inst is None or inst.state != "running":
            if inst is not None:
                self.jobs[job_id] = inst
            return
        self.inflight -= 1
        self.timed_out[job_id] = (inst.key, inst.attempt)
        limit = inst.node.task.options.timeout
        self.buf.append(("A", inst.key, inst.attempt, "timeout", None, time.time(),
                         "TimeoutError", f"no result within {limit:g}s; attempt abandoned", ""))
        try:
            self.executor.cancel(job_id, reason="timeout")
        except Exception:
            log.exception("executor.cancel failed")
        self._retry_or_fail(inst, f"attempt {inst.attempt} timed out after {limit:g}s", None)

    def _complete(self, c: Completion) -> None:
        inst = self.jobs.pop(c.job_id, None)
        if inst is None:
            late = self.timed_out.get(c.job_id)
            done = self.finished.get(c.job_id)
            if late is not None:
                self._note(late[0], late[1], "late_result_rejected",
                           f"result ({c.outcome}) arrived after the attempt timed out; "
                           "rejected, not applied")
            elif done is not None:
                # noted under the task's latest attempt (per-job attempt numbers are not
                # kept: that would cost memory on every task for a rare report)
                self._note(done.key, done.attempt, "duplicate_result_rejected",
                           f"a second report ({c.outcome}) for an attempt already finished; "
                           "rejected")
            else:
                log.warning("run %s: report for unknown job %d ignored", self.run_id, c.job_id)
            return
        self.inflight -= 1
        self.finished[c.job_id] = inst
        inst.job = None
        limit = inst.node.task.options.timeout
        if limit is not None and c.outcome == "ok" and c.ended_at - c.started_at > limit \
                and inst.state == "running":
            # it ran past its deadline before the timer could fire (e.g. inline): the
            # attempt timed out and its result is late, so it is rejected, not applied
            self.buf.append(("A", inst.key, inst.attempt, "timeout", c.started_at, c.ended_at,
                             "TimeoutError", f"no result within {limit:g}s", ""))
            self._note(inst.key, inst.attempt, "late_result_rejected",
                       f"result arrived after {c.ended_at - c.started_at:.3g}s, past the "
                       f"{limit:g}s timeout; rejected, not applied")
            self._retry_or_fail(inst, f"attempt {inst.attempt} timed out after {limit:g}s",
                                None)
            return
        self.buf.append(("A", inst.key, inst.attempt, c.outcome, c.started_at, c.ended_at,
                         c.error_type, c.error_message, c.traceback))
        for direction, uri, chash, attrs in c.lineage:
            self.buf.append(("L", inst.key, inst.attempt, direction, uri, chash, attrs))
        if c.outcome == "ok":
            self._succeed(inst, c)
        elif inst.state == "cancelling":
            if c.outcome == "cancelled" or c.outcome == "lost":
                self._move(inst, "cancelled", "executor confirmed it stopped")
                self.cancelled_tasks += 1
            else:
                self._move(inst, "failed", f"{c.error_type}: {c.error_message}")
                self.failed_tasks += 1
            self.plan.failed(inst)
        elif c.outcome == "cancelled":
            self._retry_or_fail(inst, "attempt stopped itself (cancelled)", None)
        else:
            reason = (f"{c.error_type}: {c.error_message}" if c.outcome == "error"
                      else f"attempt {c.outcome}: {c.error_message}")
            self._retry_or_fail(inst, reason, c.error)

    def _succeed(self, inst: Inst, c: Completion) -> None:
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
        self.buf.append(("R", inst.key, inst.attempt, inst.fp, enc.hash, enc.kind, data, uri,
                         enc.size, None))
        inst.fp = None      # recorded; a retry computes it again
        self._move(inst, "succeeded", "")
        self.unlock.append(inst)

    def _retry_or_fail(self, inst: Inst, reason: str, exc: BaseException | None) -> None:
        # only running attempts get here: a cancel moves every running task to
        # "cancelling" first, and _complete settles those itself
        opts = inst.node.task.options
        if opts.retryable(exc) and inst.used <= opts.retries:
            delay = opts.delay(inst.used, self.rand.random())
            self._move(inst, "retry_wait", f"{reason}; retry in {delay:.3g}s")
            self._timer(time.monotonic() + delay, "retry", inst)
            return
        why = reason if opts.retryable(exc) else f"{reason} (not retryable)"
        self._give_up(inst, why)

    def _give_up(self, inst: Inst, reason: str) -> None:
        self._move(inst, "failed", reason)
        self.failed_tasks += 1
        self._doom(inst)
        if self.settings.fail_fast and not self.cancelling:
            self._start_cancel(f"fail_fast: task {inst.key} failed")

    def _doom(self, inst: Inst) -> None:
        for d in self.plan.failed(inst):
            if d.state == "pending":
                self._move(d, "upstream_failed", f"upstream {inst.key} did not succeed")
                self.failed_tasks += 1

    def _start_cancel(self, reason: str) -> None:
        self.cancelling = True
        self.cancel_reason = reason
        self.cancel_deadline = time.monotonic() + float(
            self.settings.options.get("cancel_grace", 30))
        self.buf.append(("S", "cancelling", reason, time.time()))
        for inst in list(self.plan.insts.values()):
            st = inst.state
            if st in ("pending", "ready", "retry_wait"):
                self._move(inst, "cancelled", reason)
                self.cancelled_tasks += 1
            elif st == "running":
                self._move(inst, "cancelling", reason)
                try:
                    self.executor.cancel(inst.job.id, reason="cancel")
                except Exception:
                    log.exception("executor.cancel failed")
        self.ready.clear()
        self._commit()

    def _finish(self) -> str:
        if not self.cancelling:   # the completion invariant (Dagster's ActiveExecution)
            stuck = [i.key for i in self.plan.insts.values()
                     if i.state not in _FAILED_LIKE and i.state != "succeeded"]
            if stuck:
                raise InvalidTransitionError(
                    f"run {self.run_id} stopped with unfinished tasks: {stuck[:5]}")
        if self.cancelling:
            state = "cancelled"
            reason = getattr(self, "cancel_reason", "cancelled")
            if reason.startswith("fail_fast"):
                state = "failed"
        elif self.failed_tasks or self.cancelled_tasks:
            state = "failed"
            reason = f"{self.failed_tasks} task(s) did not succeed"
        else:
            state = "succeeded"
            reason = ""
        self.buf.append(("S", state, reason, time.time()))
        self._commit()
        return state


def driver_header(token: int) -> tuple[Any, ...]:
    """The ``H`` record a driver writes when it takes a lease."""
    return ("H", token, os.getpid(), socket.gethostname(), time.time())


def params_json(params: dict[str, Any]) -> str:
    """Serialise pipeline parameters for the ledger (repr for odd values)."""
    return json.dumps(params, default=repr, sort_keys=True)
