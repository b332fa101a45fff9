"""A frontier resume: a big run with few tasks left reads the rows of what is left.

On a DuckDB ledger a resume reads the rows of the tasks it may change and only the
keys of the successes it keeps; a kept success's row is read when a task that runs
needs its result. The run must end exactly as a resume that reads every row: the
same states, attempts, fingerprints and result.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import pipeline, task
from ledgerflow_stores.duckdb.store import DuckDBStore


def _count(name: str) -> None:
    with open(os.environ["FRONTIER_LOG"], "a") as fh:
        fh.write(name + "\n")


def _ran(tmp_path: Path) -> list[str]:
    log = tmp_path / "ran.log"
    return log.read_text().split() if log.exists() else []


@task
def inc(x: int) -> int:
    _count(f"inc{x}")
    return x + 1


@task
def flaky(x: int) -> int:
    _count(f"flaky{x}")
    if not os.path.exists(os.environ["FRONTIER_FLAG"]):
        raise ValueError("not yet")
    return x * 10


@task
def numbers(n: int) -> list[int]:
    _count("numbers")
    return list(range(n))


@task
def total(xs: list[int]) -> int:
    _count("total")
    return sum(xs)


@pipeline
def chain(n: int = 30):
    x = inc(0)
    for _ in range(n - 1):
        x = inc(x)
    return flaky(x)


@pipeline
def fanned(n: int = 12):
    parts = flaky.map(numbers(n))
    return total(parts)


@pipeline
def elementwise(n: int = 8):
    return total(flaky.map(inc.map(numbers(n))))


@task
def stepped(x: int) -> int:
    got = ledgerflow.context().step("fetch", lambda: _count("fetch") or x + 1)
    if not os.path.exists(os.environ["FRONTIER_FLAG"]):
        raise ValueError("not yet")
    return got * 10


@pipeline
def with_step():
    return stepped(inc(0))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("FRONTIER_LOG", str(tmp_path / "ran.log"))
    monkeypatch.setenv("FRONTIER_FLAG", str(tmp_path / "flag"))
    asked: list[list[str]] = []
    real = DuckDBStore.task_rows

    def counted(self: DuckDBStore, run_id: str, keys: list[str]) -> Any:
        asked.append(list(keys))
        return real(self, run_id, keys)

    monkeypatch.setattr(DuckDBStore, "task_rows", counted)
    yield {"asked": asked, "flag": tmp_path / "flag"}


def _failed(pipe: Any, store: str, env: dict[str, Any]) -> str:
    run = pipe.run(store=store, executor="inline", wait=True)
    assert run.status().state == "failed"
    env["flag"].write_text("ok")
    return run.run_id


def _rows(store: str, run_id: str) -> dict[str, tuple[Any, ...]]:
    tasks = ledgerflow.get_run(run_id, store=store).status().tasks
    return {k: (t.state, t.attempts, t.fingerprint, t.result_hash) for k, t in tasks.items()}


def test_a_chain_with_its_last_task_left_reads_one_upstream_row(
        tmp_path: Path, env: dict[str, Any]) -> None:
    store = str(tmp_path / "ledger.duckdb")
    run_id = _failed(chain, store, env)
    before = len(_ran(tmp_path))
    run = ledgerflow.resume(run_id, store=store, executor="inline")
    assert run.status().state == "succeeded"
    assert run.result() == 300
    assert _ran(tmp_path)[before:] == ["flaky30"]      # nothing kept ran again
    assert env["asked"] == [["inc-30"]]         # of 30 kept successes, flaky's upstream


def test_a_frontier_resume_ends_as_a_resume_that_reads_every_row(
        tmp_path: Path, env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for pipe in (chain, fanned, elementwise):
        lean, full = str(tmp_path / f"lean-{pipe.name}.duckdb"), \
            str(tmp_path / f"full-{pipe.name}.duckdb")
        env["flag"].unlink(missing_ok=True)
        lean_id = _failed(pipe, lean, env)
        env["flag"].unlink()
        full_id = _failed(pipe, full, env)
        a = ledgerflow.resume(lean_id, store=lean, executor="inline")
        with monkeypatch.context() as m:    # the store without its frontier read
            m.setattr(DuckDBStore, "frontier", lambda self, run_id: None)
            b = ledgerflow.resume(full_id, store=full, executor="inline")
        assert a.status().state == b.status().state == "succeeded"
        assert a.result() == b.result()
        assert _rows(lean, lean_id) == _rows(full, full_id)


def test_a_fan_out_whose_children_failed_expands_from_its_kept_source(
        tmp_path: Path, env: dict[str, Any]) -> None:
    store = str(tmp_path / "ledger.duckdb")
    run_id = _failed(fanned, store, env)
    before = _ran(tmp_path)
    assert before.count("numbers") == 1
    run = ledgerflow.resume(run_id, store=store, executor="inline")
    assert run.result() == sum(x * 10 for x in range(12))
    again = _ran(tmp_path)[len(before):]
    assert "numbers" not in again               # the source's result was read, not re-made
    assert sorted(again) == sorted([f"flaky{i}" for i in range(12)] + ["total"])
    assert env["asked"] and ["numbers"] in env["asked"]


def test_a_store_without_a_frontier_read_resumes_from_every_row(
        tmp_path: Path, env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    store = str(tmp_path / "ledger.duckdb")
    run_id = _failed(chain, store, env)
    monkeypatch.setattr(DuckDBStore, "frontier", lambda self, run_id: None)
    run = ledgerflow.resume(run_id, store=store, executor="inline")
    assert run.result() == 300
    assert env["asked"] == []                   # the full read held every row


def test_the_kept_children_a_fan_out_over_a_fan_out_needs_are_read_in_one_batch(
        tmp_path: Path, env: dict[str, Any]) -> None:
    store = str(tmp_path / "ledger.duckdb")
    run_id = _failed(elementwise, store, env)
    before = _ran(tmp_path)
    run = ledgerflow.resume(run_id, store=store, executor="inline")
    assert run.result() == sum((i + 1) * 10 for i in range(8))
    again = _ran(tmp_path)[len(before):]
    assert not [r for r in again if r.startswith("inc") or r == "numbers"], again
    # the source list with the frontier; the 8 kept children once the first flaky runs
    assert env["asked"][0] == ["numbers"]
    assert sorted(env["asked"][1]) == sorted(k for k in _rows(store, run_id)
                                             if k.startswith("inc")), env["asked"]
    assert len(env["asked"]) == 2, env["asked"]


def test_a_resume_reads_approvals_and_steps_only_when_the_run_recorded_some(
        tmp_path: Path, env: dict[str, Any]) -> None:
    plain, stepping = str(tmp_path / "plain.duckdb"), str(tmp_path / "step.duckdb")
    plain_id = _failed(chain, plain, env)
    env["flag"].unlink()
    step_id = _failed(with_step, stepping, env)
    assert DuckDBStore(plain).frontier(plain_id).signals is False   # type: ignore[union-attr]
    assert DuckDBStore(stepping).frontier(step_id).signals is True  # type: ignore[union-attr]
    run = ledgerflow.resume(step_id, store=stepping, executor="inline")
    assert run.result() == 20
    assert _ran(tmp_path).count("fetch") == 1       # the step came back, not made again


def test_a_kept_result_outside_a_batch_read_is_read_alone_when_a_task_needs_it(
        tmp_path: Path, env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerflow.frontier import Unread

    lean, full = str(tmp_path / "lean.duckdb"), str(tmp_path / "full.duckdb")
    lean_id = _failed(elementwise, lean, env)
    env["flag"].unlink()
    full_id = _failed(elementwise, full, env)
    monkeypatch.setattr(Unread, "fill_for", lambda self, inst, ready: None)
    run = ledgerflow.resume(lean_id, store=lean, executor="inline")
    with monkeypatch.context() as m:
        m.setattr(DuckDBStore, "frontier", lambda self, run_id: None)
        ledgerflow.resume(full_id, store=full, executor="inline")
    assert run.result() == sum((i + 1) * 10 for i in range(8))
    # without the batch, the resolver reads each kept child as its task needs it
    assert env["asked"][0] == ["numbers"] and len(env["asked"]) == 1 + 8, env["asked"]
    assert all(len(keys) == 1 for keys in env["asked"])
    assert _rows(lean, lean_id) == _rows(full, full_id)     # hashes filled as well
