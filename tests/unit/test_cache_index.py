"""A big cache index reaches the runner as fingerprints; its entries are read on a hit."""

from __future__ import annotations

from typing import Any

from ledgerflow import pipeline, task
from ledgerflow.store import CacheIndex
from ledgerflow_stores.duckdb import DuckDBStore


@task
def square(i: int) -> int:
    return i * i


@pipeline
def squares(start: int, n: int = 10):
    return square.map(list(range(start, start + n)))


class Recording(DuckDBStore):
    """A DuckDB store that keeps what its cache lookups returned."""

    looked_up: list[Any]

    def cache_lookup(self, task_names: Any, exclude_run: str | None = None) -> Any:
        found = super().cache_lookup(task_names, exclude_run)
        self.looked_up.append(found)
        return found


def _store(path: str, at_start: int) -> Recording:
    st = Recording(path)
    st.cache_entries_at_start = at_start
    st.looked_up = []
    return st


def test_a_run_that_hits_nothing_never_reads_the_entries(tmp_path) -> None:
    path = str(tmp_path / "l.duckdb")
    squares.run(start=0, store=path, executor="inline")          # 10 results
    st = _store(path, at_start=3)
    run = squares.run(start=100, store=st, executor="inline")
    assert run.state == "succeeded" and run.result() == [i * i for i in range(100, 110)]
    index = st.looked_up[-1]
    assert isinstance(index, CacheIndex) and len(index.fingerprints) == 10
    assert not index.loaded
    assert all(t["state"] == "succeeded" and not t["cached"] for t in run.tasks())


def test_a_hit_reads_the_entries_and_reuses_the_results(tmp_path) -> None:
    path = str(tmp_path / "l.duckdb")
    first = squares.run(start=0, store=path, executor="inline")
    squares.run(start=100, store=path, executor="inline")
    st = _store(path, at_start=3)
    run = squares.run(start=5, store=st, executor="inline")        # 5 of 10 ran before
    assert run.result() == [i * i for i in range(5, 15)]
    index = st.looked_up[-1]
    assert isinstance(index, CacheIndex) and index.loaded
    cached = {t.key: t.cached_from for t in run.status().tasks.values() if t.cached_from}
    assert len(cached) == 5 and all(c.startswith(first.run_id) for c in cached.values())


def test_a_small_index_is_read_at_once(tmp_path) -> None:
    path = str(tmp_path / "l.duckdb")
    squares.run(start=0, store=path, executor="inline")
    st = _store(path, at_start=5000)
    squares.run(start=0, store=st, executor="inline")
    assert type(st.looked_up[-1]) is dict and len(st.looked_up[-1]) == 10


def test_get_answers_a_miss_from_the_fingerprints_alone() -> None:
    loads: list[int] = []

    def load() -> dict[str, Any]:
        loads.append(1)
        return {"fp-a": ("r", "a", "h", "json", "1", None, 1)}

    index = CacheIndex({"fp-a", "fp-gone"}, load)
    assert index.get("fp-x") is None and index.get("fp-x", 0) == 0 and not loads
    assert index.get("fp-a") == ("r", "a", "h", "json", "1", None, 1) and loads == [1]
    assert index.get("fp-gone") is None     # its run was removed since the set was read
    assert loads == [1]
