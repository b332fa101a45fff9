"""The lean attempt path: a task's context is built on first use, its output kept only
when written, and what it records either way reaches the attempt's report."""

from __future__ import annotations

import contextvars
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import context, pipeline, task
from ledgerflow.context import TaskCancelled
from ledgerflow.executor import Job, execute
from tests.waiting import wait_until


def _job(fn: Any, *args: Any, **kw: Any) -> Job:
    return Job(id=7, run_id="run-1", task_key="t[3]", attempt=2, fn=fn, args=args,
               kwargs={}, code_version="v9", steps=kw.pop("steps", {}), **kw)


def test_a_plain_task_reports_its_value_and_no_output_or_records() -> None:
    c = execute(_job(lambda x: x + 1, 41))
    assert (c.outcome, c.value, c.encoded is not None) == ("ok", 42, True)
    assert (c.log, c.log_dropped, list(c.lineage), list(c.steps), list(c.notices)) == (
        "", 0, [], [], [])


def test_the_runners_job_is_the_one_the_constructor_makes() -> None:
    """``Job.of_attempt`` (positional, fast) sets every field as the keyword constructor."""
    args = dict(id=3, run_id="r", task_key="k[1]", attempt=2, fn=len, args=(1,),
                kwargs={"a": 1}, timeout=2.5, task_name="k", echo=True, code_version="v1",
                approvals={"d": 1}, steps={"s": ("json", "1")}, ledger_folder="/l",
                run_folder="/l/r")
    assert Job.of_attempt(*args.values()) == Job(**args)  # type: ignore[arg-type]
    assert Job.of_attempt(*args.values()).carrier is None


def test_context_asked_late_is_the_attempts_own_and_the_same_each_time() -> None:
    def task() -> tuple[Any, ...]:
        a, b = context(), context()
        return a is b, a.run_id, a.task_key, a.attempt, a.code_version, a.cancel_requested

    c = execute(_job(task), lambda: True)
    assert c.value == (True, "run-1", "t[3]", 2, "v9", True)


def test_what_a_task_records_through_its_context_is_reported() -> None:
    def task() -> int:
        ctx = context()
        ctx.record_input("file:///in.csv", "h1")
        ctx.notice("note", "looked twice")
        return ctx.step("fetch", lambda: 5) + ctx.step("again", lambda: 1)

    c = execute(_job(task, steps={"again": ("json", "10")}))
    assert c.value == 15        # the recorded step "again" is replayed, "fetch" runs
    assert c.lineage == [("input", "file:///in.csv", "h1", {})]
    assert [s[0] for s in c.steps] == ["fetch"]
    assert [(k, m) for k, m, _ in c.notices] == [("note", "looked twice")]


def test_a_thread_with_the_tasks_context_records_into_the_same_attempt() -> None:
    def task() -> str:
        def worker(i: int) -> None:
            context().record_output(f"file:///out{i}")
            print(f"line {i}")
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(worker, i))
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return context().task_key

    c = execute(_job(task))
    assert c.value == "t[3]"
    assert sorted(uri for _, uri, _, _ in c.lineage) == [f"file:///out{i}" for i in range(4)]
    assert sorted(c.log.splitlines()) == [f"line {i}" for i in range(4)]


def test_output_and_logging_are_captured_only_for_the_attempt_that_wrote() -> None:
    def noisy() -> None:
        print("hello")
        logging.getLogger("lean.test").warning("careful")

    loud = execute(_job(noisy))
    quiet = execute(_job(lambda: None))
    assert loud.log == "hello\nWARNING lean.test: careful\n"
    assert quiet.log == ""


def test_a_failing_task_that_asked_for_its_context_keeps_its_lineage() -> None:
    def task() -> None:
        context().record_input("file:///x")
        raise SystemExit(3)

    c = execute(_job(task))
    assert (c.outcome, c.error_type) == ("error", "SystemExit")
    assert c.lineage == [("input", "file:///x", None, {})]


# -- the runner's own in-driver attempts (ledgerflow.here): no Job, the same attempt -------

def test_an_in_driver_attempt_gets_its_context_steps_and_output_without_a_job(
        tmp_path: Path) -> None:
    """Under ``inline`` the runner calls each attempt itself: its context names the run,
    task, attempt, code version and folders; a retry replays the steps the failed attempt
    did (the step's work is counted in a file: done once) and each attempt's output is
    its own."""
    calls = tmp_path / "fetched"
    seen: list[tuple[Any, ...]] = []

    @task(retries=1)
    def fetch_then_fail_once() -> int:
        ctx = context()
        seen.append((ctx.run_id, ctx.task_key, ctx.attempt, ctx.code_version,
                     ctx.run_folder is not None))

        def fetch() -> int:
            with calls.open("a") as f:
                f.write("x")
            return 20

        got = ctx.step("fetch", fetch)
        print(f"attempt {ctx.attempt}")
        if ctx.attempt == 1:
            raise RuntimeError("once")
        return got + 1

    @pipeline
    def once():
        return fetch_then_fail_once()

    run = once.run(store=str(tmp_path / "l.duckdb"), executor="inline")
    assert (run.state, run.result()) == ("succeeded", 21)
    assert calls.read_text() == "x"         # attempt 2 got the step back
    version = fetch_then_fail_once.version
    assert seen == [(run.run_id, "fetch_then_fail_once", 1, version, True),
                    (run.run_id, "fetch_then_fail_once", 2, version, True)]
    assert [(a["attempt"], a["outcome"]) for a in run.attempts()] == [(1, "error"), (2, "ok")]
    assert [(lg["attempt"], lg["text"]) for lg in run.logs()] == [(1, "attempt 1\n"),
                                                                (2, "attempt 2\n")]


def test_an_in_driver_attempt_that_sees_a_cancel_stops_the_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A task that finds its run cancelled (``context().cancel_requested``) and raises
    TaskCancelled ends ``cancelled``, and so does the run; nothing after it starts, and no
    executor is asked to stop an attempt it never had."""
    store = str(tmp_path / "l.duckdb")
    started: list[int] = []

    @task
    def step_of(i: int) -> int:
        started.append(i)
        if i == 2:
            ledgerflow.cancel(context().run_id, store=store)    # as another process would
            wait_until(lambda: context().cancel_requested, what="the cancel seen")
            raise TaskCancelled("asked to stop")
        return i

    @pipeline
    def steps():
        return [step_of(i) for i in range(5)]

    run = steps.run(store=store, executor="inline")
    assert run.state == "cancelled"
    assert started == [0, 1, 2]
    states = {t["key"]: t["state"] for t in run.tasks()}
    assert states == {"step_of": "succeeded", "step_of-2": "succeeded",
                      "step_of-3": "cancelled", "step_of-4": "cancelled",
                      "step_of-5": "cancelled"}
    assert "executor.cancel failed" not in caplog.text
