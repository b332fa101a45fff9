"""The observer seams: committed records, and a carrier per attempt entered where it runs."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
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


ENTERED: list[tuple[str, str]] = []


@contextlib.contextmanager
def _marked(task_key: str) -> Iterator[None]:
    token = SEEN.set(task_key)
    ENTERED.append(("enter", task_key))
    try:
        yield
    finally:
        SEEN.reset(token)
        ENTERED.append(("exit", task_key))


@dataclass
class MarkCarrier:
    """A carrier whose scope marks the task call (picklable: it travels with the job)."""

    headers: dict[str, str]

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return _marked(self.headers["x-task"])


class CarrierObserver:
    """Hands every attempt a carrier naming it."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        ENTERED.clear()

    @property
    def entered(self) -> list[tuple[str, str]]:
        return list(ENTERED)

    @hookimpl
    def ledgerflow_job_carrier(self, task_key: str, attempt: int) -> MarkCarrier:
        self.asked.append((task_key, attempt))
        return MarkCarrier({"traceparent": f"00-{attempt:032x}-{1:016x}-01", "x-task": task_key})


@pytest.mark.parametrize("executor", ["inline", "threads"])
def test_a_carrier_reaches_the_task_and_its_scope_wraps_the_call(tmp_path: Path,
                                                                   executor: str) -> None:
    obs = CarrierObserver()
    with registered(obs):
        run = single.run(store=str(tmp_path / "l.duckdb"), executor=executor)
    got = run.result()
    assert obs.asked == [("carried", 1)]
    assert got == {"carrier": {"traceparent": f"00-{1:032x}-{1:016x}-01", "x-task": "carried"},
                   "scope": "carried"}
    assert obs.entered == [("enter", "carried"), ("exit", "carried")]


def test_a_carrier_travels_to_a_worker_process_and_its_scope_runs_there(tmp_path: Path
                                                                         ) -> None:
    obs = CarrierObserver()
    with registered(obs):
        run = single.run(store=str(tmp_path / "l.duckdb"), executor="processes", workers=1)
    got = run.result()
    assert got == {"carrier": {"traceparent": f"00-{1:032x}-{1:016x}-01", "x-task": "carried"},
                   "scope": "carried"}
    assert obs.entered == []        # entered in the worker, not here


class BadScope:
    headers: dict[str, str] = {"k": "v"}

    def scope(self) -> contextlib.AbstractContextManager[None]:
        raise RuntimeError("cannot enter")


def test_a_broken_carrier_never_fails_the_attempt(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        @hookimpl
        def ledgerflow_job_carrier(self) -> BadScope:
            return BadScope()

    with registered(Broken()):
        run = chain.run(store=str(tmp_path / "l.duckdb"), executor="inline", n=1)
    assert run.state == "succeeded"
    assert "entering an attempt carrier's scope failed" in caplog.text


def test_a_task_error_passes_through_the_carrier_scope(tmp_path: Path) -> None:
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


def test_observers_hear_every_change_and_a_failing_one_never_breaks_the_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One Observers object: hooks and the progress display, each call guarded once."""
    heard: list[tuple[str, str, str]] = []
    begun: list[dict[str, int]] = []

    class Display:                         # a progress display with begin()
        def begin(self, counts: dict[str, int]) -> None:
            begun.append(dict(counts))

        def __call__(self, key: str, old: str, new: str) -> None:
            heard.append((key, old, new))
            raise RuntimeError("the display broke")

    class Loud:
        @hookimpl
        def ledgerflow_attempt_finished(self, task_key: str, outcome: str) -> None:
            raise ValueError(f"observer of {task_key} broke")

    path = str(tmp_path / "l.duckdb")
    with registered(Loud()):
        run = failing.run(store=path, executor="inline", progress=Display())
    assert run.state == "failed"                            # as without observers
    assert ("boom", "", "pending") in heard and heard[-1] == ("boom", "running", "failed")
    assert "progress display failed" in caplog.text
    assert "ledgerflow_attempt_finished hook failed" in caplog.text
    assert begun == []                                      # a new run starts at zero
    again = ledgerflow.resume(run.run_id, store=path, executor="inline", pipeline=failing,
                              progress=Display())
    assert again.state == "failed"
    assert begun == [{"failed": 1}]                         # a resume starts from its counts
