"""An executor's ``queue_ahead``: jobs without a timeout are submitted beyond ``workers``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import ledgerflow
from ledgerflow import context, pipeline, task
from ledgerflow.executor import Completion, Job, execute
from tests.waiting import wait_until


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
            self._run(job)

    def _run(self, job: Job) -> None:
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


class TimingExecutor(QueueingExecutor):
    """Times jobs from their start itself (``timeout_from_start``), as a cluster does;
    a job of ``late_task`` is reported ``timeout`` first and its result after."""

    timeout_from_start = True

    def __init__(self, ahead: int, pause: float = 0.01, late_task: str = "") -> None:
        super().__init__(ahead)
        self.pause = pause
        self.late_task = late_task

    def _run(self, job: Job) -> None:
        time.sleep(self.pause)
        assert self._done is not None
        if job.task_name == self.late_task and job.attempt == 1:
            self._done(Completion(job.id, "timeout", error_type="TaskTimedOut",
                                  error_message="no result within its timeout",
                                  has_value=False))
        super()._run(job)


@task(timeout=0.3, retries=1)
def slow_once(x: int) -> int:
    return x


@pipeline
def late_one():
    return slow_once(7)


def test_an_executor_timing_from_the_start_gets_timed_jobs_queued_ahead(tmp_path):
    # the executor counts each timeout from the job's start: waiting in its queue costs
    # none of it, so the runner queues timed jobs ahead as it does untimed ones
    ex = TimingExecutor(ahead=5, pause=0.2)
    run = timed.run(n=6, store=str(tmp_path / "l.duckdb"), executor=ex, workers=1)
    assert run.state == "succeeded"
    assert run.result() == [2 * i for i in range(6)]
    assert ex.most_held == 6            # one a worker, five ahead, timeouts and all


def test_a_result_after_the_executors_timeout_is_rejected_as_late(tmp_path):
    ex = TimingExecutor(ahead=0, late_task=slow_once.name)
    run = late_one.run(store=str(tmp_path / "l.duckdb"), executor=ex, workers=1)
    assert run.state == "succeeded" and run.result() == 7
    assert [a["outcome"] for a in run.attempts()] == ["timeout", "ok"]
    assert [n["kind"] for n in run.notices()] == ["late_result_rejected"]


#: The items ``held`` started (the threads executor's test).
STARTED: list[int] = []


@task
def held(i: int) -> int:
    STARTED.append(i)
    wait_until(lambda: context().cancel_requested, timeout=60, what="a cancel request")
    context().raise_if_cancelled()
    return i


@pipeline
def holding(n: int):
    return held.map(list(range(n)))


def test_the_threads_executor_queues_jobs_ahead_and_a_cancelled_one_never_runs():
    # one thread: the first item holds it until the cancel; the other five are handed
    # over at once, shown running from their dispatch, and the cancel ends them before
    # they start
    STARTED.clear()
    store = "memory:threads-queue-ahead"
    done: list[ledgerflow.Run] = []
    driver = threading.Thread(target=lambda: done.append(holding.run(
        n=6, store=store, executor="threads", workers=1)))
    driver.start()
    try:
        wait_until(lambda: STARTED == [0], what="the first item to start")
        run_id = ledgerflow.runs(store=store)[0].run_id
        counts = wait_until(lambda: (c := ledgerflow.get_run(run_id, store=store).status()
                                     .counts()).get("running") == 6 and c,
                            what="six items handed to the thread")
        assert counts == {"running": 6}
        assert ledgerflow.cancel(run_id, store=store) == "requested"
        wait_until(lambda: ledgerflow.get_run(run_id, store=store).state != "running",
                   timeout=60, what="the cancel to reach the driver")
    finally:
        driver.join(60)
    (run,) = done
    assert run.state == "cancelled"
    assert STARTED == [0]                    # the queued five never ran
    assert {t["key"]: t["state"] for t in run.tasks()} == {
        f"held[{i}]": "cancelled" for i in range(6)}
