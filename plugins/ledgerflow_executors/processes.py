"""The ``processes`` executor: worker processes that can be stopped for real.

Each worker is a forked process fed through a pipe. A timeout or a cancel
ends the worker (SIGKILL) and starts a fresh one, so an abandoned attempt
cannot deliver a late result. A worker that dies on its own reports its
attempt as ``lost``. Functions travel with cloudpickle: module-level tasks by
reference, tasks defined in ``__main__`` or a notebook by value.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from ledgerflow import hookimpl
from ledgerflow.config import Settings
from ledgerflow.executor import Completion, Job, execute


def _worker_main(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the driver's business
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        job: Job = cloudpickle.loads(payload)
        c = execute(job, None, keep_value=False)
        try:
            data = cloudpickle.dumps(c)
        except Exception:
            c.error = None   # the exception itself cannot travel; its text does
            data = cloudpickle.dumps(c)
        try:
            conn.send_bytes(data)
        except (BrokenPipeError, OSError):
            return


class _Worker:
    __slots__ = ("conn", "job", "proc")

    def __init__(self, ctx: Any) -> None:
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.conn: Connection = parent
        self.job: Job | None = None


class ProcessExecutor:
    """Runs jobs in ``workers`` forked processes; kills them to stop a job."""

    name = "processes"

    def __init__(self) -> None:
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        self._ctx = mp.get_context(method)
        self._workers: list[_Worker] = []
        self._queue: deque[Job] = deque()
        self._lock = threading.Lock()
        self._done: Callable[[Completion], None] | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._payloads: dict[int, bytes] = {}

    def start(self, *, workers: int, on_complete: Callable[[Completion], None]) -> None:
        self._done = on_complete
        self._workers = [_Worker(self._ctx) for _ in range(workers)]
        self._thread = threading.Thread(target=self._pump, daemon=True,
                                        name="ledgerflow-processes")
        self._thread.start()

    def submit(self, job: Job) -> None:
        payload = cloudpickle.dumps(job)   # fails here, in the driver, if unpicklable
        with self._lock:
            self._queue.append(job)
            self._payloads[job.id] = payload
            self._assign()

    def _assign(self) -> None:
        for w in self._workers:
            if not self._queue:
                return
            if w.job is None and w.proc.is_alive():
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
            ready = wait([*conns, self._wake_r], timeout=0.5)
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
                c: Completion = pickle.loads(data)
                with self._lock:
                    w.job = None
                    self._assign()
                self._report(c)

    def _replace(self, w: _Worker, outcome: str | None, message: str) -> None:
        with self._lock:
            job = w.job
            w.job = None
            with contextlib.suppress(Exception):
                w.proc.kill()
            with contextlib.suppress(Exception):
                w.conn.close()
            w.proc.join(timeout=5)
            if w in self._workers and not self._stop:
                self._workers[self._workers.index(w)] = _Worker(self._ctx)
            self._assign()
        if job is not None and outcome is not None:
            self._report(Completion(job.id, outcome, error_message=message,
                                    started_at=time.time(), ended_at=time.time(),
                                    has_value=False))

    def cancel(self, job_id: int, *, reason: str) -> None:
        with self._lock:
            for job in list(self._queue):
                if job.id == job_id:
                    self._queue.remove(job)
                    self._payloads.pop(job_id, None)
                    self._report(Completion(job_id, "cancelled", has_value=False))
                    return
            target = next((w for w in self._workers if w.job is not None
                           and w.job.id == job_id), None)
        if target is None:
            return
        # a timed-out attempt is already abandoned: killing it just stops the work
        self._replace(target, "cancelled" if reason == "cancel" else None,
                      f"worker stopped ({reason})")

    def shutdown(self) -> None:
        self._stop = True
        self._done = None
        os.write(self._wake_w, b"x")
        with self._lock:
            workers, self._workers = self._workers, []
        for w in workers:
            with contextlib.suppress(Exception):
                w.conn.close()
            if w.proc.is_alive():
                w.proc.kill()
            w.proc.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)




@hookimpl
def ledgerflow_executor_names() -> list[str]:
    return ["processes"]


@hookimpl
def ledgerflow_make_executor(name: str, settings: Settings) -> ProcessExecutor | None:
    return ProcessExecutor() if name == "processes" else None
