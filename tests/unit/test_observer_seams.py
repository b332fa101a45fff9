"""The observer seams: committed records, a carrier per attempt, and its context in the worker."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import context, hookimpl, pipeline, task
from ledgerflow.plugins import get_plugin_manager
from ledgerflow.records import AttemptEnded, Record, ResultRecorded, RunDefined, Transition
from ledgerflow.store import RunStore
from ledgerflow_stores.duckdb import DuckDBStore

SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="")


@task
def one(i: int) -> int:
    return i + 1


@task
def carried() -> dict[str, Any]:
    return {"carrier": context().carrier, "scope": SEEN.get()}


@task(retries=1, retry_delay=0)
def boom() -> int:
    raise ValueError("no")


@pipeline
def chain(n: int = 3):
    x = one(0)
    for _ in range(1, n):
        x = one(x)
    return x


@pipeline
def single():
    return carried()


@pipeline
def failing():
    return boom()


@contextlib.contextmanager
def registered(plugin: object) -> Iterator[None]:
    pm = get_plugin_manager()
    pm.register(plugin, name=f"test-{id(plugin)}")
    try:
        yield
    finally:
        pm.unregister(plugin)


def test_records_hook_sees_every_commit_in_order_after_it_is_durable(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.duckdb")
    batches: list[list[Record]] = []
    durable: list[int] = []

    class Observer:
        @hookimpl
        def ledgerflow_records_committed(self, run_id: str, records: Sequence[Record],
                                         store: RunStore) -> None:
            batches.append(list(records))
            assert store.location == path
            if any(isinstance(r, Transition) for r in records):
                # a fresh reader sees every transition of this commit already
                view = DuckDBStore(path).get_run(run_id)
                durable.append(view.max_seq)

    with registered(Observer()):
        run = chain.run(store=path, executor="threads")
    assert run.state == "succeeded"
    flat = [r for b in batches for r in b]
    assert isinstance(flat[0], RunDefined)            # the creation commit comes first
    seqs = [r.seq for r in flat if isinstance(r, Transition)]
    assert seqs == sorted(seqs) == list(range(1, len(seqs) + 1))
    assert len(seqs) == 3 * 4                        # pending, ready, running, succeeded
    for batch, seen_seq in zip([b for b in batches if any(isinstance(r, Transition) for r in b)],
                               durable, strict=True):
        assert seen_seq >= max(r.seq for r in batch if isinstance(r, Transition))
    results = [r for r in flat if isinstance(r, ResultRecorded)]
    assert [r.fingerprint is not None for r in results] == [True] * 3
    assert len([r for r in flat if isinstance(r, AttemptEnded)]) == 3


def test_a_resume_commit_reaches_the_hook_too(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.duckdb")
    run = failing.run(store=path, executor="inline")
    assert run.state == "failed"
    kinds: list[str] = []

    class Observer:
        @hookimpl
        def ledgerflow_records_committed(self, records: Sequence[Record]) -> None:
            kinds.extend(type(r).__name__ for r in records)

    with registered(Observer()):
        again = ledgerflow.resume(run.run_id, store=path, executor="inline", pipeline=failing)
    assert again.state == "failed"
    assert kinds[:2] == ["DriverHeader", "RunStateChanged"]     # the takeover's commit
    assert kinds.count("AttemptEnded") == 2                     # a fresh budget: 2 attempts


def test_no_observer_means_no_hook_on_the_hot_path(tmp_path: Path) -> None:
    run = chain.run(store=str(tmp_path / "l.duckdb"), executor="inline", n=1)
    assert run._runner is not None
    assert run._runner.hook_records is None
    assert run._runner.hook_carrier is None


class CarrierObserver:
    """Hands every attempt a carrier naming it, and marks the task call with a context."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        self.entered: list[tuple[str, str]] = []

    @hookimpl
    def ledgerflow_job_carrier(self, task_key: str, attempt: int) -> dict[str, str]:
        self.asked.append((task_key, attempt))
        return {"traceparent": f"00-{attempt:032x}-{1:016x}-01", "x-task": task_key}

    @hookimpl
    def ledgerflow_attempt_context(self, carrier: Mapping[str, str], task_key: str
                                   ) -> contextlib.AbstractContextManager[None]:
        @contextlib.contextmanager
        def scope() -> Iterator[None]:
            token = SEEN.set(carrier["x-task"])
            self.entered.append(("enter", task_key))
            try:
                yield
            finally:
                SEEN.reset(token)
                self.entered.append(("exit", task_key))
        return scope()


@pytest.mark.parametrize("executor", ["inline", "threads"])
def test_a_carrier_reaches_the_task_and_its_context_wraps_the_call(tmp_path: Path,
                                                                   executor: str) -> None:
    obs = CarrierObserver()
    with registered(obs):
        run = single.run(store=str(tmp_path / "l.duckdb"), executor=executor)
    got = run.result()
    assert obs.asked == [("carried", 1)]
    assert got == {"carrier": {"traceparent": f"00-{1:032x}-{1:016x}-01", "x-task": "carried"},
                   "scope": "carried"}
    assert obs.entered == [("enter", "carried"), ("exit", "carried")]


def test_a_carrier_travels_to_a_worker_process(tmp_path: Path) -> None:
    obs = CarrierObserver()
    with registered(obs):
        run = single.run(store=str(tmp_path / "l.duckdb"), executor="processes", workers=1)
    got = run.result()
    # the worker process has its own plugins (from entry points): the data arrives,
    # this test's in-process context hook does not run there
    assert got["carrier"]["x-task"] == "carried"
    assert got["scope"] == ""


def test_a_broken_attempt_context_never_fails_the_attempt(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        @hookimpl
        def ledgerflow_job_carrier(self) -> dict[str, str]:
            return {"k": "v"}

        @hookimpl
        def ledgerflow_attempt_context(self) -> contextlib.AbstractContextManager[None]:
            class Bad:
                def __enter__(self) -> None:
                    raise RuntimeError("cannot enter")

                def __exit__(self, *exc: object) -> None:
                    return None
            return Bad()

    with registered(Broken()):
        run = chain.run(store=str(tmp_path / "l.duckdb"), executor="inline", n=1)
    assert run.state == "succeeded"
    assert "entering an attempt context failed" in caplog.text


def test_a_task_error_passes_through_the_attempt_context(tmp_path: Path) -> None:
    obs = CarrierObserver()
    with registered(obs):
        run = failing.run(store=str(tmp_path / "l.duckdb"), executor="threads")
    assert run.state == "failed"
    assert [a["outcome"] for a in run.attempts()] == ["error", "error"]
    assert obs.entered == [("enter", "boom"), ("exit", "boom")] * 2
    assert obs.asked == [("boom", 1), ("boom", 2)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="program tasks are Linux only")
def test_a_program_task_gets_the_carrier_as_environment_variables(tmp_path: Path) -> None:
    from ledgerflow import program
    show = program("show", [sys.executable, "-c",
                            "import os; print(os.environ.get('TRACEPARENT'), "
                            "os.environ.get('X_TASK'))"])

    @pipeline
    def prog():
        return show()

    with registered(CarrierObserver()):
        run = prog.run(store=str(tmp_path / "l.duckdb"), executor="threads")
    out = run.result()["stdout"].strip()
    assert out == f"00-{1:032x}-{1:016x}-01 show"
