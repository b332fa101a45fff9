"""The executor contract: behaviour every :class:`~ledgerflow.executor.Executor` must show.

Subclass :class:`ExecutorContract` and set ``executor_name`` (an executor
your plugin registers; override :meth:`ExecutorContract.make_executor` to
configure it). The tests drive the executor directly (each job reported
exactly once, cancels confirmed) and through real runs on the memory store
(a late result after a timeout is rejected, never applied). The task
functions live in this module, so worker processes can import them.

Example:
    >>> class TestMyExecutor(ExecutorContract):     # doctest: +SKIP
    ...     executor_name = "mine"
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Settings
from ..context import TaskCancelled, context
from ..executor import Completion, Executor, Job
from ..pipeline import pipeline
from ..task import task


def double(x: int) -> int:
    """A trivial job function."""
    return 2 * x


def wait_for_cancel(limit: float) -> str:
    """Block until the attempt is asked to stop (then end ``cancelled``)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if context().cancel_requested:
            raise TaskCancelled(context().task_key)
        time.sleep(0.01)
    return "never cancelled"


@task(timeout=0.5, retries=0)
def overstay(marker: str) -> str:
    """Ignore cancellation and answer after the timeout (a late result)."""
    time.sleep(1.5)
    Path(marker).write_text("finished late")
    return "late"


@pipeline
def late_pipeline(marker: str) -> Any:
    return overstay(marker)


@task
def until_cancelled(limit: float) -> str:
    """A task that stops itself when its run is cancelled."""
    return wait_for_cancel(limit)


@pipeline
def cancel_pipeline(limit: float = 20.0) -> Any:
    return until_cancelled(limit)


@task(retries=2)
def exits(how: str) -> str:
    """Raise a BaseException that is not an Exception (what a tool wrapping argparse does)."""
    import sys
    if how == "sys.exit":
        sys.exit(3)
    if how == "KeyboardInterrupt":
        raise KeyboardInterrupt
    raise GeneratorExit("closed")


@task
def bystander(x: int) -> int:
    """An independent task that should succeed beside one that exits."""
    return x + 1


@pipeline
def exit_pipeline(how: str) -> Any:
    return exits(how), bystander(1)


class ExecutorContract:
    """Behaviour every executor must show (see the module docstring)."""

    executor_name: str = ""
    #: How long a test waits for reports (process and cluster executors start slowly).
    patience: float = 30.0

    def make_executor(self) -> Executor:
        """A fresh executor, built through the plugin manager."""
        from ..opening import make_executor
        return make_executor(self.executor_name, Settings(workers=2))

    def _collect(self, ex: Executor) -> tuple[list[Completion], threading.Event,
                                               Callable[[int], None]]:
        reports: list[Completion] = []
        got = threading.Event()
        want = {"n": 1}

        def on_complete(c: Completion) -> None:
            reports.append(c)
            if len(reports) >= want["n"]:
                got.set()

        ex.start(workers=2, on_complete=on_complete)

        def expect(n: int) -> None:
            want["n"] = n
            if len(reports) >= n:
                got.set()
        return reports, got, expect

    def _job(self, job_id: int, fn: Callable[..., Any], *args: Any) -> Job:
        return Job(id=job_id, run_id="contract", task_key=f"t{job_id}", attempt=1, fn=fn,
                   args=args, kwargs={}, task_name="t")

    def test_each_job_is_reported_exactly_once(self) -> None:
        ex = self.make_executor()
        reports, got, expect = self._collect(ex)
        try:
            expect(12)
            for i in range(1, 13):
                ex.submit(self._job(i, double, i))
            assert got.wait(self.patience), f"only {len(reports)} of 12 reports"
            time.sleep(0.3)                  # a second report would arrive meanwhile
        finally:
            ex.shutdown()
        ids = sorted(c.job_id for c in reports)
        assert ids == list(range(1, 13)), ids
        assert all(c.outcome == "ok" for c in reports)
        assert sorted(c.encoded.data for c in reports if c.encoded) == sorted(
            str(2 * i).encode() for i in range(1, 13))

    def test_a_cancel_is_confirmed(self) -> None:
        ex = self.make_executor()
        reports, got, _ = self._collect(ex)
        try:
            ex.submit(self._job(1, wait_for_cancel, 20.0))
            time.sleep(0.5)                   # let it start
            ex.cancel(1, reason="cancel")
            assert got.wait(self.patience), "the cancel was never confirmed"
            time.sleep(0.3)
        finally:
            ex.shutdown()
        assert [(c.job_id, c.outcome) for c in reports] == [(1, "cancelled")]

    def test_a_run_cancel_reaches_a_running_task(self, tmp_path: Path) -> None:
        run = cancel_pipeline.run(store=f"memory:{tmp_path}", executor=self.make_executor(),
                                  workers=1, wait=False)
        end = time.monotonic() + self.patience
        while run.status().tasks.get("until_cancelled") is None or \
                run.status().tasks["until_cancelled"].state != "running":
            assert time.monotonic() < end, "the task never started"
            time.sleep(0.02)
        run.cancel()
        assert run.wait(self.patience) == "cancelled"
        row = run.status().tasks["until_cancelled"]
        assert row.state == "cancelled"
        assert [a["outcome"] for a in run.attempts()] == ["cancelled"]

    def test_a_task_raising_a_base_exception_fails_only_its_attempt(
            self, tmp_path: Path) -> None:
        """``SystemExit``, ``KeyboardInterrupt`` and ``GeneratorExit`` from a task end its
        attempt as an ``error`` that is not retried; the run goes on and ends."""
        for how, kind in (("sys.exit", "SystemExit"),
                          ("KeyboardInterrupt", "KeyboardInterrupt"),
                          ("GeneratorExit", "GeneratorExit")):
            run = exit_pipeline.run(how, store=f"memory:{tmp_path / kind}",
                                    executor=self.make_executor(), workers=2, wait=False)
            assert run.wait(self.patience) == "failed", f"{kind}: the run did not end"
            rows = run.status().tasks
            assert rows["exits"].state == "failed", kind
            assert rows["bystander"].state == "succeeded", kind
            attempts = run.attempts("exits")
            # one attempt of three: not retried (retry_on names Exception subclasses)
            assert [(a["outcome"], a["error_type"]) for a in attempts] == [("error", kind)]

    def test_a_late_result_after_a_timeout_is_rejected(self, tmp_path: Path) -> None:
        marker = tmp_path / f"late-{uuid.uuid4().hex}"
        run = late_pipeline.run(str(marker), store=f"memory:{tmp_path}",
                                executor=self.make_executor(), workers=1)
        assert run.state == "failed"
        row = run.status().tasks["overstay"]
        assert row.state == "failed" and row.result_hash is None
        assert [a["outcome"] for a in run.attempts()] == ["timeout"]
