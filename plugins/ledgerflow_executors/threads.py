"""The ``threads`` executor (the default): a pool of daemon threads.

A thread cannot be killed: on cancel or timeout the attempt's
``context().cancel_requested`` turns true and the runner stops waiting for
it (a timed-out attempt's late result is rejected). An abandoned thread is
replaced so the pool keeps its size.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from ledgerflow import hookimpl
from ledgerflow.config import Settings
from ledgerflow.executor import Completion, Job, execute

_STOP = None
#: Jobs without a timeout kept queued per worker thread beyond the busy ones
#: (``queue_ahead``): a worker that ends one starts the next at once instead of
#: waiting for the driver (a 10,000-task fan-out on 4 threads: ~68-90 -> ~46-55 µs a
#: task). A queued job shows ``running`` from its dispatch, as on Dask; its attempt's
#: ``started_at`` is when a thread started it, and one cancelled while queued never runs.
AHEAD_PER_WORKER = 8


class _Flag:
    """A job's cancel flag (its attempt polls ``is_set``; nothing waits on it, so no
    ``threading.Event``: one of those a job cost the driver ~2 µs)."""

    __slots__ = ("abandoned", "cancelled")

    def __init__(self) -> None:
        self.cancelled = False
        self.abandoned = False      # timed out: a replacement thread took its place

    def is_set(self) -> bool:
        return self.cancelled


class ThreadExecutor:
    """Runs jobs on ``workers`` threads, replacing abandoned ones.

    When a task without a timeout is the only one that can run (a chain), the
    runner calls it in the driver thread instead (``inline_when_alone``): a
    thread hand-off per task would add ~50 µs and change nothing else. Jobs
    without a timeout queue ahead of the threads (:data:`AHEAD_PER_WORKER`).
    """

    name = "threads"
    inline_when_alone = True
    queue_ahead = 0             # set by start(): AHEAD_PER_WORKER a thread

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._done: Callable[[Completion], None] | None = None
        self._flags: dict[int, _Flag] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, *, workers: int, on_complete: Callable[[Completion], None]) -> None:
        self._done = on_complete
        self.queue_ahead = AHEAD_PER_WORKER * workers
        for _ in range(workers):
            self._spawn()

    def _spawn(self) -> None:
        t = threading.Thread(target=self._work, name="ledgerflow-worker", daemon=True)
        self._threads.append(t)
        t.start()

    def _work(self) -> None:
        q = self._queue
        while True:
            job = q.get()
            if job is None:
                return
            flag = self._flags.get(job.id)
            if flag is None:
                continue
            if flag.is_set():   # cancelled before it started: confirm without running it
                c = Completion(job.id, "cancelled", has_value=False)
            else:
                c = execute(job, flag.is_set)
            with self._lock:
                self._flags.pop(job.id, None)
                abandoned = flag.abandoned
            done = self._done
            if done is not None:
                done(c)
            if abandoned:   # a replacement already took this thread's place
                return

    def submit(self, job: Job) -> None:
        self._flags[job.id] = _Flag()
        self._queue.put(job)

    def cancel(self, job_id: int, *, reason: str) -> None:
        with self._lock:
            flag = self._flags.get(job_id)
            if flag is None:
                return
            flag.cancelled = True
            if reason == "timeout":
                flag.abandoned = True
                self._spawn()

    def shutdown(self) -> None:
        for flag in list(self._flags.values()):
            flag.cancelled = True
        for _ in self._threads:
            self._queue.put(_STOP)
        self._done = None


@hookimpl
def ledgerflow_executor_names() -> list[str]:
    return ["threads"]


@hookimpl
def ledgerflow_make_executor(name: str, settings: Settings) -> ThreadExecutor | None:
    return ThreadExecutor() if name == "threads" else None
