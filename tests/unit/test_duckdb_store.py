"""The DuckDB ledger answers exactly as the in-memory one for the same runs."""

from __future__ import annotations

import pytest

from ledgerflow import pipeline, task
from ledgerflow_stores import duckdb_store


@task(retries=1)
def maybe(i: int) -> int:
    if i % 97 == 0:
        raise ValueError(f"item {i}")
    return i


@task
def total(xs: list[int]) -> int:
    return sum(xs)


@pipeline
def fan(n: int):
    return total(maybe.map(list(range(n))))


def _rows(view):
    return {k: (t.state, t.attempts, t.error, t.result_hash, t.cached_from is None, t.position)
            for k, t in view.tasks.items()}


@pytest.mark.parametrize(("n", "batch"), [(30, None), (3000, None), (3000, 20_000)],
                         ids=["small", "large", "large-in-many-batches"])
def test_fold_matches_the_memory_store(tmp_path, monkeypatch, n: int, batch: int | None) -> None:
    if batch is not None:
        monkeypatch.setattr(duckdb_store, "FOLD_BATCH_BYTES", batch)
    mem = fan.run(n=n, store=f"memory:{tmp_path}", executor="inline")
    disk = fan.run(n=n, store=str(tmp_path / "l.duckdb"), executor="inline")
    a, b = mem.status(), disk.status()
    assert a.state == b.state == "failed"
    assert _rows(a) == _rows(b)
    # and read back from the folded tables alone (the journal is gone after the fold)
    assert not list((tmp_path / "l.duckdb.d" / "journals").glob("*.jsonl"))
    assert [x["outcome"] for x in disk.attempts("maybe[0]")] == ["error", "error"]
