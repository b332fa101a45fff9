"""The ``dask`` executor: run attempts on a Dask ``distributed`` cluster.

By default it starts a private ``LocalCluster`` (worker processes, one thread
each, bound to 127.0.0.1) and closes it in :meth:`DaskExecutor.shutdown`;
with ``settings.dask_address`` / ``LEDGERFLOW_DASK_ADDRESS`` it connects to an
existing scheduler instead and leaves it running.

How the kernel's contract maps onto Dask:

* one :class:`~ledgerflow.executor.Job` = one Dask task with a unique key,
  submitted with ``retries=0``; a task's function travels once per worker, a
  job carries its key, attempt and arguments, a plain success comes back as
  its encoded result (:mod:`ledgerflow_dask.wire`; the driver alone writes
  the ledger);
* a job with a timeout announces its start from the worker and its timeout
  counts from there (a job waiting in Dask's queue does not time out); with
  no result in time it is reported ``timeout``, the worker is asked to stop
  and a late result is still reported; the runner rejects it as late
  (``timeout_from_start``). A
  timeout the runner decides (``cancel(job, reason="timeout")``) comes first;
* a worker that dies mid-task: the private cluster's scheduler has
  ``allowed_failures=0``, so the task ends in ``KilledWorker`` and is
  reported ``lost`` (the runner retries within the task's budget). On a
  scheduler that would re-run it by itself, each worker announces the jobs
  it starts; a second start of the same job reports the first one ``lost``
  and stops the re-run;
* ``cancel(job_id, reason)`` marks the job cancelled in every worker process
  (``context().cancel_requested`` turns true, and a job that has not started
  never runs). For ``reason="cancel"`` the future is also cancelled after
  ``cancel_grace`` seconds (or the task's ``stop_grace``, if longer: a program
  task needs TERM, its grace and KILL) unless the task stopped by itself, and reported
  ``cancelled``. Dask cannot stop a running Python thread: a task that
  ignores the request keeps its worker thread busy until it returns (its
  result is then dropped). For ``reason="timeout"`` the future is left
  alone, so the late result, if it comes, reaches the runner, which rejects
  it and records a notice;
* each job id is reported at most once: the first report removes the job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ledgerflow.config import Settings
from ledgerflow.errors import ConfigError, PluginError
from ledgerflow.executor import Completion, Job

from .wire import Specs, arguments, decode, extras, failure, stopped
from .worker import MISSING, mark_cancelled, run_job

log = logging.getLogger("ledgerflow.dask")

_STOP = ("stop",)
#: Jobs queued ahead per worker thread by default: enough that a worker finds its next
#: task waiting while the previous result travels back through the scheduler.
_AHEAD_PER_THREAD = 64


@dataclass(slots=True)
class _Entry:
    """A submitted job: its future, Dask key and bookkeeping."""

    future: Any
    key: str
    submitted: float
    payload: Any = None            # a scattered payload future, kept alive with the job
    cancel_reason: str | None = None
    starts: int = 0
    stop_grace: float = 0.0        # what the task says it needs to stop (program tasks)
    timeout: float | None = None   # counted from the worker's start announcement
    started_at: float = 0.0        # wall time the worker announced (0: not yet)
    job: Any = None                # the Job, its arguments as they travel (to send again)
    args: Any = None
    kwargs: Any = None


class DaskExecutor:
    """Runs jobs as Dask tasks on a local or remote ``distributed`` cluster.

    Args:
        address: scheduler address (``tcp://host:8786``); None starts a LocalCluster.
        client: an existing ``distributed.Client`` to use (not closed at shutdown).
        n_workers: worker processes of the local cluster (default: min(workers, cores)).
        cancel_grace: seconds a cancelled running task gets to stop by itself
            before its future is cancelled and the job reported ``cancelled``.
        scatter_above: payloads larger than this many bytes are scattered to the
            workers first instead of travelling inside the task graph.
        ship_modules: module names whose code is pickled by value (for modules
            the workers cannot import); pipeline files loaded by path always are.
        connect_timeout: seconds to wait for a remote scheduler.
        direct: fetch results straight from the workers (default: yes on the
            local cluster, Dask's choice otherwise).
        queue_ahead: jobs without a timeout kept submitted beyond ``workers``, so
            the cluster always has the next ones while results travel back
            (default: 64 per worker thread of the cluster; 0 submits one job per
            free worker, like the other executors).
        cluster_kwargs: extra keyword arguments for ``LocalCluster``.
    """

    name = "dask"
    #: Jobs' timeouts count from the worker's start of the attempt, and this executor
    #: enforces them (reports ``timeout``): a runner that honours this may queue jobs
    #: with a timeout ahead too, without a timer of its own from the submit.
    timeout_from_start = True

    def __init__(self, address: str | None = None, *, client: Any = None,
                 n_workers: int | None = None, cancel_grace: float = 1.0,
                 scatter_above: int = 1 << 20, ship_modules: Iterable[str] = (),
                 connect_timeout: float = 10.0, direct: bool | None = None,
                 queue_ahead: int | None = None,
                 cluster_kwargs: dict[str, Any] | None = None) -> None:
        self.address = address
        self.n_workers = n_workers
        self.cancel_grace = cancel_grace
        self.scatter_above = scatter_above
        self.ship_modules = tuple(ship_modules)
        self.connect_timeout = connect_timeout
        self.cluster_kwargs = dict(cluster_kwargs or {})
        self.client: Any = client
        self.cluster: Any = None
        self._own_client = False
        self._done: Callable[[Completion], None] | None = None
        self._jobs: dict[int, _Entry] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._deadlines: dict[int, float] = {}
        self._thread: threading.Thread | None = None
        self._token = secrets.token_hex(4)
        self._topic: str | None = None
        self._watch = False             # announce every start (the scheduler re-runs)
        self._timeouts: dict[int, float] = {}   # job id -> monotonic deadline
        self._late: dict[int, _Entry] = {}      # timed out here; result still to come
        self._specs = Specs(self._token, self.ship_modules)
        self._direct = direct
        self._queue_ahead = queue_ahead
        #: read by the runner after :meth:`start` (see ledgerflow.executor.Executor)
        self.queue_ahead = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> DaskExecutor:
        """Build from settings (``dask_address``; options ``dask_cancel_grace``...)."""
        opts = settings.options
        raw = opts.get("dask_queue_ahead")
        ahead = None
        if raw not in (None, ""):
            try:
                ahead = int(raw)
            except ValueError:
                raise ConfigError(f"dask_queue_ahead must be a whole number, given: {raw!r}",
                                  hint="pass 0 or more (0: one job per free worker)") from None
        return cls(settings.dask_address,
                   cancel_grace=float(opts.get("dask_cancel_grace", 1.0)),
                   queue_ahead=ahead,
                   connect_timeout=float(opts.get("dask_connect_timeout", 10.0)),
                   ship_modules=[m for m in opts.get("dask_ship_modules", "").split(",") if m])

    # -- connecting ---------------------------------------------------------------------
    def connect(self, workers: int = 2) -> Any:
        """Connect to the scheduler or start the local cluster; return the client."""
        if self.client is not None:
            return self.client
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:
            raise PluginError(f"the dask executor needs dask.distributed: {exc}",
                              hint="pip install 'ledgerflow[dask]'") from None
        if self.address:
            try:
                self.client = Client(self.address, timeout=self.connect_timeout,
                                     set_as_default=False)
            except Exception as exc:
                raise ConfigError(
                    f"cannot reach the Dask scheduler at {self.address}: {exc}",
                    hint="start one (dask scheduler --host 127.0.0.1) or drop --dask-address "
                    "to use a local cluster") from None
        else:
            n = self.n_workers or max(1, min(workers, os.cpu_count() or 1))
            kwargs: dict[str, Any] = {
                "n_workers": n, "threads_per_worker": 1, "processes": True,
                "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0",
                "scheduler_kwargs": {"allowed_failures": 0},
                "silence_logs": logging.ERROR,
            }
            kwargs.update(self.cluster_kwargs)
            self.cluster = LocalCluster(**kwargs)
            self.client = Client(self.cluster, set_as_default=False)
            if self._direct is None:    # fetch results from the workers, not via the scheduler
                self._direct = True
        self._own_client = True
        return self.client

    def _watch_starts(self) -> None:
        """Hear start announcements: of jobs with a timeout, and of every job if the
        scheduler re-runs tasks of dead workers."""
        try:
            allowed = self.client.run_on_scheduler(_allowed_failures)
        except Exception:   # cannot tell: be safe
            allowed = 1
        self._watch = bool(allowed)
        self._topic = f"ledgerflow-start-{self._token}"
        self.client.subscribe_topic(self._topic, self._on_event)

    # -- the Executor protocol ----------------------------------------------------------
    def start(self, *, workers: int, on_complete: Callable[[Completion], None]) -> None:
        """Connect (or start the local cluster) and the reporting thread."""
        self._done = on_complete
        self.connect(workers)
        if self._queue_ahead is not None:
            self.queue_ahead = max(0, self._queue_ahead)
        else:
            try:
                threads = sum(self.client.nthreads().values())
            except Exception:   # cannot tell: as many as the runner's workers
                threads = workers
            self.queue_ahead = _AHEAD_PER_THREAD * max(1, threads)
        self._watch_starts()
        self._thread = threading.Thread(target=self._control, name="ledgerflow-dask",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Send ``job`` to the cluster as one Dask task."""
        client = self.client
        stop_grace = float(getattr(job.fn, "stop_grace", 0.0))
        spec = self._specs.get(client, job, self._topic)
        args, kwargs = arguments(job)
        scattered = None
        if kwargs is None and len(args) > self.scatter_above:
            args = scattered = client.scatter(args, hash=False, direct=False)
        entry = _Entry(None, f"{spec.prefix}{job.id}", time.time(), scattered,
                       stop_grace=stop_grace, timeout=job.timeout, job=job, args=args,
                       kwargs=kwargs)
        with self._lock:
            self._jobs[job.id] = entry
        self._send(entry, spec.id, entry.key)

    def _send(self, entry: _Entry, spec: str | tuple[str, bytes], key: str) -> None:
        job = entry.job
        more = extras(job)
        announce = self._watch or job.timeout is not None
        tail = (announce, more) if more is not None else (True,) if announce else ()
        entry.future = self.client.submit(
            run_job, spec, job.id, job.task_key, job.attempt, entry.args, entry.kwargs, *tail,
            key=key, pure=False, retries=0)
        entry.future.add_done_callback(partial(self._on_done, job.id))

    def cancel(self, job_id: int, *, reason: str) -> None:
        """Ask ``job_id`` to stop (never blocks; see the module docstring)."""
        self._queue.put(("cancel", job_id, reason))

    def shutdown(self) -> None:
        """Stop reporting, drop what is left, close what this executor started."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(30)
        self._done = None
        with self._lock:
            left, self._jobs = list(self._jobs.values()), {}
        left += self._late.values()
        self._late, self._timeouts = {}, {}
        client = self.client
        self._specs.clear(client)
        if client is not None and left:
            with contextlib.suppress(Exception):
                client.run(mark_cancelled, [e.key for e in left], on_error="ignore")
            with contextlib.suppress(Exception):
                client.cancel([e.future for e in left if e.future is not None],
                              reason="ledgerflow shutdown")
        if self._topic and client is not None:
            with contextlib.suppress(Exception):
                client.unsubscribe_topic(self._topic)
            with contextlib.suppress(Exception):   # the scheduler keeps a topic's events
                client.run_on_scheduler(_forget_topic, topic=self._topic)
        if self._own_client:
            self.client = None
            self._own_client = False
            with contextlib.suppress(Exception):
                client.close()
            if self.cluster is not None:
                cluster, self.cluster = self.cluster, None
                with contextlib.suppress(Exception):
                    cluster.close()

    # -- worker process ids (tests and diagnostics) -------------------------------------
    def worker_pids(self) -> dict[str, int]:
        """``{worker address: pid}`` of the connected workers."""
        return dict(self.client.run(os.getpid))

    # -- internals ----------------------------------------------------------------------
    def _on_done(self, job_id: int, _fut: Any) -> None:
        self._queue.put(("done", job_id))

    def _on_event(self, event: tuple[float, Any]) -> None:
        """A worker's ``("s", job id, start time)`` or ``("r", job id, answer)``."""
        tag, job_id, what = event[1]
        self._queue.put(("started" if tag == "s" else "answer", job_id, what))

    def _control(self) -> None:
        """The reporting thread: batch results, apply cancels, detect lost jobs."""
        q = self._queue
        while True:
            wait = 0.5
            if self._deadlines or self._timeouts:
                wait = max(0.0, min(*self._deadlines.values(), *self._timeouts.values(),
                                    time.monotonic() + wait) - time.monotonic())
            batch: list[tuple[Any, ...]] = []
            with contextlib.suppress(queue.Empty):
                batch.append(q.get(timeout=wait))
                while True:
                    batch.append(q.get_nowait())
            try:
                self._handle(batch)
            except Exception:   # a broken connection must not kill the reporter silently
                log.exception("dask executor: reporting failed")
            if _STOP in batch:
                return

    def _handle(self, batch: list[tuple[Any, ...]]) -> None:
        done: list[int] = []
        marks: list[str] = []
        lost: list[int] = []
        now = time.monotonic()
        for item in batch:
            kind = item[0]
            if kind == "done":
                done.append(item[1])
            elif kind == "answer":
                self._answer(item[1], item[2])
            elif kind == "cancel":
                _, job_id, reason = item
                entry = self._jobs.get(job_id)
                if entry is None:
                    continue
                entry.cancel_reason = reason
                marks.append(entry.key)
                self._timeouts.pop(job_id, None)    # the runner decided (or it is cancelled)
                if reason != "timeout":
                    self._deadlines[job_id] = now + max(self.cancel_grace, entry.stop_grace)
            elif kind == "started":
                entry = self._jobs.get(item[1])
                if entry is not None:
                    entry.starts += 1
                    if entry.starts > 1 and self._watch:
                        lost.append(item[1])
                    elif entry.timeout is not None and entry.cancel_reason is None \
                            and not entry.started_at:
                        entry.started_at = item[2]
                        self._timeouts[item[1]] = now + entry.timeout
        if marks:
            self.client.run(mark_cancelled, marks, on_error="ignore")
        if done:
            self._collect(done)
        if lost:
            self._lose(lost, "the Dask worker running it was lost; Dask started it again, "
                       "that re-run was stopped")
        expired = [j for j, t in self._deadlines.items() if t <= time.monotonic()]
        for j in expired:
            del self._deadlines[j]
        self._hard_cancel([j for j in expired if j in self._jobs])
        late = [j for j, t in self._timeouts.items() if t <= time.monotonic()]
        if late:
            self._time_out(late)

    def _time_out(self, job_ids: list[int]) -> None:
        """No result within the timeout since the worker started: report ``timeout``,
        ask the worker to stop, keep the future to log its late result."""
        keys = []
        for job_id in job_ids:
            del self._timeouts[job_id]
            entry = self._jobs.get(job_id)
            if entry is None or entry.timeout is None:
                continue
            keys.append(entry.key)
            self._late[job_id] = entry
            self._report(job_id, Completion(
                job_id, "timeout", error_type="TaskTimedOut",
                error_message=f"no result within {entry.timeout:g}s of its start on the "
                "Dask worker; attempt abandoned", started_at=entry.started_at,
                ended_at=time.time(), has_value=False))
        if keys:
            with contextlib.suppress(Exception):
                self.client.run(mark_cancelled, keys, on_error="ignore")

    def _answer(self, job_id: int, data: Any) -> None:
        """A job's answer pushed by its worker (its ``done`` then finds it reported)."""
        entry = self._jobs.get(job_id)
        if entry is None:
            self._rejected(job_id, data)
            return
        self._report(job_id, decode(job_id, data, entry.submitted))

    def _rejected(self, job_id: int, data: Any = None) -> None:
        """Report the late result of a job timed out here to the runner, which rejects
        it (once, by the first of its answer and its ``done``)."""
        late, done = self._late.pop(job_id, None), self._done
        if late is not None and done is not None:
            done(decode(job_id, data, late.submitted) if data is not None else Completion(
                job_id, "ok", ended_at=time.time(), has_value=False))

    def _collect(self, job_ids: list[int]) -> None:
        from distributed.scheduler import KilledWorker

        finished: list[tuple[int, _Entry]] = []
        for job_id in job_ids:
            entry = self._jobs.get(job_id)
            if entry is None:
                self._rejected(job_id)
                continue
            status = entry.future.status
            if status == "finished":
                finished.append((job_id, entry))
            elif status == "error":
                exc = entry.future.exception()
                if isinstance(exc, KilledWorker):
                    self._lose([job_id], f"the Dask worker running it died ({exc})")
                else:
                    self._report(job_id, failure(job_id, entry.submitted, exc))
            elif status == "cancelled":
                if entry.cancel_reason is not None:
                    self._report(job_id, stopped(job_id, entry.submitted))
                else:
                    self._lose([job_id], "Dask dropped the task (scheduler or worker lost)")
            elif status == "lost":
                self._lose([job_id], "the result was lost with its Dask worker")
        if not finished:
            return
        try:
            values = self.client.gather([e.future for _, e in finished], direct=self._direct)
        except Exception:
            values = [self._one(e) for _, e in finished]
        for (job_id, entry), data in zip(finished, values, strict=True):
            if data is None:
                self._lose([job_id], "the result was lost with its Dask worker")
                continue
            if data == MISSING:     # a worker new since the spec was registered
                spec = self._specs.get(self.client, entry.job, self._topic)
                self._send(entry, (spec.id, spec.data), f"{entry.key}~{secrets.token_hex(2)}")
                continue
            self._report(job_id, decode(job_id, data, entry.submitted))

    def _one(self, entry: _Entry) -> Any:
        try:
            return entry.future.result(timeout=30)
        except Exception:
            return None

    def _lose(self, job_ids: list[int], why: str) -> None:
        entries = []
        for job_id in job_ids:
            entry = self._jobs.get(job_id)
            if entry is None:
                continue
            entries.append(entry)
            self._report(job_id, Completion(job_id, "lost", error_type="WorkerLost",
                                            error_message=why, started_at=entry.submitted,
                                            ended_at=time.time(), has_value=False))
        if entries:     # stop anything Dask may still be re-running for them
            with contextlib.suppress(Exception):
                self.client.run(mark_cancelled, [e.key for e in entries], on_error="ignore")
            with contextlib.suppress(Exception):
                self.client.cancel([e.future for e in entries], reason="ledgerflow: lost")

    def _hard_cancel(self, job_ids: list[int]) -> None:
        entries = [(j, self._jobs[j]) for j in job_ids if j in self._jobs]
        if not entries:
            return
        with contextlib.suppress(Exception):
            self.client.cancel([e.future for _, e in entries], reason="ledgerflow cancel")
        for job_id, entry in entries:
            self._report(job_id, stopped(job_id, entry.submitted))

    def _report(self, job_id: int, c: Completion) -> None:
        with self._lock:
            entry = self._jobs.pop(job_id, None)
        self._deadlines.pop(job_id, None)
        done = self._done
        if entry is not None and done is not None:
            done(c)


def _allowed_failures(dask_scheduler: Any) -> int:
    """How often the scheduler re-runs a task whose worker died (runs on the scheduler)."""
    return int(dask_scheduler.allowed_failures)


def _forget_topic(dask_scheduler: Any, topic: str) -> None:
    """Drop the events the scheduler keeps for ``topic`` (runs on the scheduler)."""
    dask_scheduler._broker._topics.pop(topic, None)

