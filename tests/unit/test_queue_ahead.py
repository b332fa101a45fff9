"""An executor's ``queue_ahead``: jobs without a timeout are submitted beyond ``workers``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import ledgerflow
from ledgerflow import pipeline, task
from ledgerflow.executor import Completion, Job, execute


class QueueingExecutor:
    """Runs one job at a time on a thread of its own, like a one-worker cluster with a
    queue; counts how many jobs it held (submitted, not yet reported) at most."""

    name = "queueing"

    def __init__(self, ahead: int) -> None:
        self.queue_ahead = ahead
        self.held = 0
        self.most_held = 0
        self._lock = threading.Lock()
        self._jobs: list[Job] = []
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._done: Callable[[Completion], None] | None = None
        self._thread: threading.Thread | None = None

    def start(self, *, workers: int, on_complete: Callable[[Completion], None]) -> None:
        self._done = on_complete
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            self.held += 1
            self.most_held = max(self.most_held, self.held)
            self._jobs.append(job)
            self._wake.notify()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._stop:
                    self._wake.wait()
                if self._stop:
                    return
                job = self._jobs.pop(0)
            time.sleep(0.01)
            c = execute(job, lambda: False)
            with self._lock:
                self.held -= 1
            assert self._done is not None
            self._done(c)

    def cancel(self, job_id: int, *, reason: str) -> None:
        return None

    def shutdown(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(5)


@task
def double(x: int) -> int:
    return 2 * x


@task(timeout=30)
def double_in_time(x: int) -> int:
    return 2 * x


@pipeline
def untimed(n: int):
    return double.map(list(range(n)))


@pipeline
def timed(n: int):
    return double_in_time.map(list(range(n)))


def test_jobs_without_timeout_are_queued_ahead(tmp_path):
    ex = QueueingExecutor(ahead=3)
    run = untimed.run(n=12, store=str(tmp_path / "l.duckdb"), executor=ex, workers=1)
    assert run.state == "succeeded"
    assert run.result() == [2 * i for i in range(12)]
    assert ex.most_held == 4            # one a worker, three ahead


def test_jobs_with_a_timeout_wait_for_a_free_worker(tmp_path):
    ex = QueueingExecutor(ahead=3)
    run = timed.run(n=6, store=str(tmp_path / "l.duckdb"), executor=ex, workers=1)
    assert run.state == "succeeded"
    assert ex.most_held == 1            # the timeout counts from the submit: none waits


def test_no_queue_ahead_keeps_one_job_a_worker(tmp_path):
    ex = QueueingExecutor(ahead=0)
    run = untimed.run(n=6, store=str(tmp_path / "l.duckdb"), executor=ex, workers=2)
    assert run.state == "succeeded"
    assert ex.most_held == 2
    assert ledgerflow.get_run(run.run_id, store=str(tmp_path / "l.duckdb")).state == "succeeded"
