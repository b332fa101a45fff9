"""The ``processes`` executor: worker processes that can be stopped for real.

(Its plugin, :mod:`ledgerflow_executors.processes`, imports this module when
the executor is first made.)

Workers are started from a *forkserver* (a clean single-threaded process
that has imported ``ledgerflow`` and this module once), never by forking the
threaded driver; where there is no forkserver, with *spawn*. Jobs travel with
cloudpickle: tasks of importable modules by reference, tasks of ``__main__``,
a notebook or a pipeline file loaded by path by value.

* **Stopping a job** (cancel or timeout): the worker is asked first, so the
  attempt's ``context().cancel_requested`` turns true and the task can stop
  by itself (a program task stops its process tree). If the job has not
  ended after a grace period (``stop_grace``, or the task's own
  ``stop_grace`` if longer), the worker and everything it started are
  SIGKILLed and a fresh worker takes its place; a cancel is confirmed only
  once they are gone. A timed-out attempt is already abandoned by the
  runner: its late report, if it comes, is rejected there.
* **Workers die with their driver.** Each worker holds the read end of a
  lifeline pipe whose write end only the driver holds; a thread in the
  worker reads it (cancel requests arrive on it) and on EOF, i.e. when the
  driver exited or was SIGKILLed, kills the worker's children and the worker.
  (``PR_SET_PDEATHSIG`` is not used: it fires when the parent *thread* exits.)
* A worker that dies on its own reports its attempt as ``lost``.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from ledgerflow.config import Settings
from ledgerflow.executor import Completion, Job, execute
from ledgerflow.procs import alive
from ledgerflow.programs.tree import descendants, is_supervisor, supervisor_pids

#: What the forkserver imports once, so each worker starts in milliseconds
#: (``_forkserver``: workers do not run the driver's ``__main__`` again).
PRELOAD = ["ledgerflow", "ledgerflow.programs", "ledgerflow_executors.process_pool",
           "ledgerflow_executors._forkserver"]
WORKER_NAME = "ledgerflow-worker"      # = _forkserver.WORKER_NAME
_HELLO = b"ready"
_START_FAILURES = 3          # workers dying before they are ready: give up after this many


def _context() -> Any:
    """The forkserver context (preloaded), else spawn; never fork."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return mp.get_context("spawn")


# -- the worker process ----------------------------------------------------------------

def _die() -> None:
    """The driver is gone: kill what this worker started, then the worker.

    Program supervisors are left alone: they see their own lifeline (held by
    this process) close and stop their whole trees themselves.
    """
    with contextlib.suppress(Exception):
        for pid in descendants(os.getpid(), prune=supervisor_pids()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _watch(lifeline: Connection, cancelled: set[int]) -> None:
    """Worker thread: job ids to cancel arrive here; EOF means the driver is gone."""
    while True:
        try:
            data = lifeline.recv_bytes()
        except (EOFError, OSError):
            _die()
            return
        cancelled.add(int.from_bytes(data, "little"))


def _worker_main(conn: Connection, lifeline: Connection, env: dict[str, str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the driver's business
    os.environ.clear()                             # the driver's environment, as of now
    os.environ.update(env)
    cancelled: set[int] = set()
    threading.Thread(target=_watch, args=(lifeline, cancelled), daemon=True,
                     name="ledgerflow-lifeline").start()
    conn.send_bytes(_HELLO)
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        job: Job = cloudpickle.loads(payload)
        c = execute(job, functools.partial(cancelled.__contains__, job.id), keep_value=False)
        cancelled.discard(job.id)
        try:
            data = cloudpickle.dumps(c)
        except Exception:
            c.error = None   # the exception itself cannot travel; its text does
            data = cloudpickle.dumps(c)
        try:
            conn.send_bytes(data)
        except (BrokenPipeError, OSError):
            return


# -- the driver side -------------------------------------------------------------------

class _Worker:
    __slots__ = ("conn", "job", "lifeline", "proc", "ready", "stop_at", "stop_reason")

    def __init__(self, ctx: Any) -> None:
        parent, child = ctx.Pipe()
        life_r, life_w = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_worker_main, args=(child, life_r, dict(os.environ)),
                                daemon=True, name=WORKER_NAME)
        self.proc.start()
        child.close()
        life_r.close()
        self.conn: Connection = parent
        self.lifeline: Connection = life_w      # only this process holds the write end
        self.job: Job | None = None
        self.ready = False
        self.stop_at: float | None = None
        self.stop_reason = ""

    def kill(self) -> list[int]:
        """SIGKILL the worker and what it started; return every process that was there.

        Program supervisors are spared: the worker's death closes their lifelines
        and each stops its whole tree (it is their subreaper, so nothing escapes).
        """
        root = self.proc.pid or 0
        everything = [root, *descendants(root)]
        sups = [p for p in everything if is_supervisor(p)]
        for pid in [root, *descendants(root, prune=sups)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for c in (self.conn, self.lifeline):
            with contextlib.suppress(Exception):
                c.close()
        return everything


def _gone(pids: list[int], timeout: float) -> bool:
    """Wait until none of ``pids`` is alive (zombies count as gone)."""
    end = time.monotonic() + timeout
    while True:
        if not any(alive(p) for p in pids):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)


class ProcessExecutor:
    """Runs jobs in ``workers`` worker processes; ends a worker to stop a job for sure.

    Args:
        stop_grace: seconds a job asked to stop (cancel or timeout) gets to end by
            itself before its worker is killed (a task's own ``stop_grace``
            attribute, as program tasks have, extends it).
    """

    name = "processes"

    def __init__(self, *, stop_grace: float = 1.0) -> None:
        self.stop_grace = stop_grace
        self._ctx = _context()
        self._workers: list[_Worker] = []
        self._queue: deque[Job] = deque()
        self._lock = threading.Lock()
        self._done: Callable[[Completion], None] | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._payloads: dict[int, bytes] = {}
        self._shipped: set[str] = set()
        self._start_failures = 0
        self._broken = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> ProcessExecutor:
        """Build from settings (option ``processes_stop_grace``, seconds)."""
        return cls(stop_grace=float(settings.options.get("processes_stop_grace", 1.0)))

    def start(self, *, workers: int, on_complete: Callable[[Completion], None]) -> None:
        self._done = on_complete
        self._workers = [_Worker(self._ctx) for _ in range(workers)]
        self._thread = threading.Thread(target=self._pump, daemon=True,
                                        name="ledgerflow-processes")
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._ship(job.fn)
        payload = cloudpickle.dumps(job)   # fails here, in the driver, if unpicklable
        with self._lock:
            if self._broken:
                self._report(_failed(job.id, self._broken))
                return
            self._queue.append(job)
            self._payloads[job.id] = payload
            self._assign()

    def _ship(self, fn: Callable[..., Any]) -> None:
        """Pickle a pipeline file loaded by path by value: workers cannot import it."""
        name = getattr(fn, "__module__", None) or ""
        if name in self._shipped:
            return
        self._shipped.add(name)
        mod = sys.modules.get(name)
        if mod is not None and name != "__main__" and getattr(mod, "__ledgerflow_file__", None):
            cloudpickle.register_pickle_by_value(mod)

    def _assign(self) -> None:
        for w in self._workers:
            if not self._queue:
                break
            if w.job is None and w.stop_at is None and w.proc.is_alive():
                job = self._queue.popleft()
                w.job = job
                try:
                    w.conn.send_bytes(self._payloads.pop(job.id))
                except OSError:
                    self._report(Completion(job.id, "lost", error_message="worker unavailable",
                                            has_value=False))
                    w.job = None
        os.write(self._wake_w, b"x")

    def _report(self, c: Completion) -> None:
        done = self._done
        if done is not None:
            done(c)

    def _pump(self) -> None:
        while not self._stop:
            with self._lock:
                conns = {w.conn: w for w in self._workers}
                stops = [w.stop_at for w in self._workers if w.stop_at is not None]
            wait_s = 0.5
            if stops:
                wait_s = max(0.0, min(min(stops) - time.monotonic(), wait_s))
            ready = wait([*conns, self._wake_r], timeout=wait_s)
            for r in ready:
                if r == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                w = conns[r]  # type: ignore[index]
                try:
                    data = w.conn.recv_bytes()
                except (EOFError, OSError):
                    self._replace(w, "lost", "worker process died")
                    continue
                if data == _HELLO:
                    w.ready = True
                    self._start_failures = 0
                    continue
                c: Completion = pickle.loads(data)
                with self._lock:
                    w.job = None
                    w.stop_at = None
                    self._assign()
                self._report(c)     # after a timeout: a late report, which the runner rejects
            now = time.monotonic()
            with self._lock:
                due = [w for w in self._workers if w.stop_at is not None and w.stop_at <= now]
            for w in due:
                self._hard_stop(w)

    def _retire(self, w: _Worker) -> Job | None:
        """Take ``w`` out of service, start its replacement; return its job."""
        with self._lock:
            job, w.job = w.job, None
            if w in self._workers:
                if self._stop or self._broken:
                    self._workers.remove(w)
                else:
                    self._workers[self._workers.index(w)] = _Worker(self._ctx)
            self._assign()
        return job

    def _hard_stop(self, w: _Worker) -> None:
        """The job did not stop in time: kill its worker; confirm a cancel once all is gone."""
        reason = w.stop_reason
        w.stop_at = None
        pids = w.kill()
        job = self._retire(w)

        def confirm() -> None:
            if not _gone(pids, 2.0):
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                _gone(pids, 5.0)
            with contextlib.suppress(Exception):
                w.proc.join(timeout=1)
            if job is not None and reason == "cancel":
                now = time.time()
                self._report(Completion(job.id, "cancelled", error_message="worker killed "
                                        "after the cancel grace", started_at=now,
                                        ended_at=now, has_value=False))

        threading.Thread(target=confirm, daemon=True, name="ledgerflow-stop").start()

    def _replace(self, w: _Worker, outcome: str, message: str) -> None:
        """``w`` died on its own (its pipe closed): report its job, start another."""
        if not w.ready:
            self._start_failures += 1
            if self._start_failures >= _START_FAILURES:
                self._broken = ("worker processes die as they start (their error is on the "
                                "driver's stderr)")
        w.kill()
        with contextlib.suppress(Exception):
            w.proc.join(timeout=5)
        job = self._retire(w)
        now = time.time()
        if job is not None:
            self._report(Completion(job.id, outcome, error_message=message, started_at=now,
                                    ended_at=now, has_value=False))
        if self._broken:
            with self._lock:
                queued, self._queue = list(self._queue), deque()
                self._payloads.clear()
            for q in queued:
                self._report(_failed(q.id, self._broken))

    def cancel(self, job_id: int, *, reason: str) -> None:
        with self._lock:
            for job in list(self._queue):
                if job.id == job_id:
                    self._queue.remove(job)
                    self._payloads.pop(job_id, None)
                    if reason == "cancel":      # a timed-out one is abandoned already
                        self._report(Completion(job_id, "cancelled", has_value=False))
                    return
            target = next((w for w in self._workers if w.job is not None
                           and w.job.id == job_id), None)
            if target is None or target.stop_at is not None:
                return
            assert target.job is not None
            grace = max(self.stop_grace, float(getattr(target.job.fn, "stop_grace", 0.0)))
            target.stop_at = time.monotonic() + grace
            target.stop_reason = reason
            try:   # ask first: the attempt sees context().cancel_requested
                target.lifeline.send_bytes(job_id.to_bytes(8, "little"))
            except OSError:
                target.stop_at = time.monotonic()
        os.write(self._wake_w, b"x")

    def shutdown(self) -> None:
        self._stop = True
        self._done = None
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            workers, self._workers = self._workers, []
        pids: list[int] = []
        for w in workers:
            pids += w.kill()
        _gone(pids, 5.0)
        for w in workers:
            with contextlib.suppress(Exception):
                w.proc.join(timeout=1)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _failed(job_id: int, message: str) -> Completion:
    now = time.time()
    return Completion(job_id, "error", error_type="WorkerStartError", error_message=message,
                      started_at=now, ended_at=now, has_value=False)
