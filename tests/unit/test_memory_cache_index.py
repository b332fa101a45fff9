"""The memory store's cache index: a run's successes are read once it is idle, not again
at every later lookup, and the entry a lookup gives is still the newest run's."""

from __future__ import annotations

from typing import Any

import pytest

from ledgerflow import pipeline, task
from ledgerflow.records import AttemptEnded, ResultRecorded, RunStateChanged, Transition
from ledgerflow.testing.stores import run_records, started
from ledgerflow_stores.memory import MemoryStore

#: when the records below say things happened (any time will do)
NOW = 1_800_000_000.0


def _succeed(st: MemoryStore, run_id: str, key: str, fp: str, *, release: bool = True) -> Any:
    lease = st.create_run(run_id, run_records(run_id))
    now = NOW
    st.append(lease, [*started(key, now),
                      AttemptEnded(key, 1, "ok", now, now, "", "", ""),
                      ResultRecorded(key, 1, fp, f"h-{run_id}", "json", "1", None, 1, None),
                      Transition(4, key, 1, "running", "succeeded", "", now)])
    if release:
        st.append(lease, [RunStateChanged("succeeded", "", now)])
        st.release(lease)
    return lease


def _counting_reads(st: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs whose successes the store goes through (each one's index, every entry)."""
    reads: list[str] = []
    plain = st._successes

    def counted(run_id: str) -> Any:
        reads.append(run_id)
        return plain(run_id)

    monkeypatch.setattr(st, "_successes", counted)
    return reads


def test_an_idle_runs_successes_are_read_once_for_every_later_lookup(
        monkeypatch: pytest.MonkeyPatch) -> None:
    st = MemoryStore("memory:index-once")
    for i in range(20):
        _succeed(st, f"r{i:02d}", "a", f"fp-{i}")
    reads = _counting_reads(st, monkeypatch)
    assert st.cache_lookup(["a"])["fp-3"][0] == "r03"
    assert sorted(reads) == [f"r{i:02d}" for i in range(20)]       # each once
    reads.clear()
    _succeed(st, "r20", "a", "fp-20")
    hits = st.cache_lookup(["a"])
    assert reads == ["r20"]             # only the run that is new since
    assert (hits["fp-20"][0], hits.get("fp-0", "none")[0], hits.get("fp-x")) == (
        "r20", "r00", None)
    assert st.cache_lookup(["b"]).get("fp-1") is None      # another task's fingerprint


def test_the_newest_run_wins_and_an_excluded_one_gives_way_to_the_next() -> None:
    st = MemoryStore("memory:index-newest")
    for run_id in ("c1", "c2", "c3"):
        _succeed(st, run_id, "a", "fp-same")
    assert st.cache_lookup(["a"])["fp-same"][:3] == ("c3", "a", "h-c3")
    assert st.cache_lookup(["a"], exclude_run="c3")["fp-same"][0] == "c2"
    assert dict(st.cache_lookup(["a"], exclude_run="c3")) == {
        "fp-same": st.cache_lookup(["a"], exclude_run="c3")["fp-same"]}


def test_a_run_still_driven_is_read_as_it_is_now() -> None:
    st = MemoryStore("memory:index-live")
    _succeed(st, "old", "a", "fp-1")
    lease = _succeed(st, "driven", "a", "fp-1", release=False)
    assert st.cache_lookup(["a"])["fp-1"][0] == "driven"     # newer, though not idle yet
    now = NOW
    st.append(lease, [*started("b", now, seq=5),
                      AttemptEnded("b", 1, "ok", now, now, "", "", ""),
                      ResultRecorded("b", 1, "fp-2", "h", "json", "2", None, 1, None),
                      Transition(8, "b", 1, "running", "succeeded", "", now)])
    assert st.cache_lookup(["b"])["fp-2"][0] == "driven"      # what it did since
    st.release(lease)
    assert st.cache_lookup(["a", "b"])["fp-2"][0] == "driven"


def test_a_notebooks_tenth_run_reuses_the_first_runs_results() -> None:
    """What a user sees: a pipeline run again in the same store reuses its results, however
    many runs of other inputs came between."""
    calls: list[int] = []

    @task
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    @pipeline
    def squares(n: int):
        return square.map(list(range(n)))

    store = "memory:index-notebook"
    for n in range(1, 11):
        squares.run(n=n, store=store, executor="inline")
    assert sorted(calls) == list(range(10))         # each item computed once
    assert squares.run(n=10, store=store, executor="inline").result() == [
        x * x for x in range(10)]
    assert len(calls) == 10
