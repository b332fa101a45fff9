"""A contract test suite for run stores, shipped so plugin authors can reuse it.

Subclass :class:`StoreContract` in your tests and give it ``make_store(tmp_path)``
returning a fresh store; pytest collects the inherited tests.

Example:
    >>> class TestMyStore(StoreContract):            # doctest: +SKIP
    ...     make_store = staticmethod(lambda tmp: MyStore(tmp / "db"))
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import LeaseLostError, NotResumableError, RunNotFoundError
from .results import encode
from .store import RunStore


def _memory(tmp: Path) -> RunStore:
    from ledgerflow_stores.memory import MemoryStore
    return MemoryStore(f"memory:{tmp}")


def _duckdb(tmp: Path) -> RunStore:
    from ledgerflow_stores.duckdb_store import DuckDBStore
    return DuckDBStore(str(tmp / "ledger.duckdb"))


STORE_FACTORIES: dict[str, Callable[[Path], RunStore]] = {"memory": _memory, "duckdb": _duckdb}


def _records(run_id: str) -> list[tuple[Any, ...]]:
    now = time.time()
    return [("D", run_id, "p", None, "{}", now, "{}"), ("H", 1, 1, "host", now),
            ("S", "running", "", now)]


def _started(key: str, now: float) -> list[tuple[Any, ...]]:
    """Records of task ``key`` created and running its first attempt."""
    return [("T", key, key, key, None, None, [], "v1", now),
            ("E", 1, key, 0, None, "pending", "", now),
            ("E", 2, key, 0, "pending", "ready", "", now),
            ("E", 3, key, 1, "ready", "running", "attempt 1", now)]


class StoreContract:
    """Behaviour every :class:`~ledgerflow.store.RunStore` must show."""

    make_store: Callable[[Path], RunStore]

    def _store(self, tmp_path: Path) -> RunStore:
        return self.make_store(tmp_path)

    def test_records_fold_into_task_rows(self, tmp_path: Path) -> None:
        st = self._store(tmp_path)
        lease = st.create_run("r1", _records("r1"))
        now = time.time()
        st.append(lease, [
            *_started("a", now),
            ("A", "a", 1, "error", now, now, "ValueError", "boom", ""),
            ("E", 4, "a", 1, "running", "retry_wait", "", now),
            ("E", 5, "a", 1, "retry_wait", "ready", "", now),
            ("E", 6, "a", 2, "ready", "running", "attempt 2", now + 1),
        ])
        row = st.get_run("r1").tasks["a"]
        assert (row.state, row.attempts, row.error) == ("running", 2, "ValueError: boom")
        st.append(lease, [
            ("A", "a", 2, "ok", now, now, "", "", ""),
            ("R", "a", 2, "fp1", "h1", "json", "42", None, 2, None),
            ("E", 7, "a", 2, "running", "succeeded", "", now + 2),
            ("S", "succeeded", "", now + 2),
        ])
        st.release(lease)
        view = st.get_run("r1")
        row = view.tasks["a"]
        assert view.state == "succeeded"
        assert (row.state, row.attempts, row.error, row.result_hash) == ("succeeded", 2, None, "h1")
        assert row.started_at == now and row.ended_at == now + 2
        assert st.read_blob(row.result_kind or "", row.result_data, row.result_uri) == 42
        assert [a["outcome"] for a in st.attempts("r1")] == ["error", "ok"]
        assert st.cache_lookup(["a"])["fp1"][0] == "r1"

    def test_cache_index_has_one_entry_per_fingerprint_from_the_newest_run(
            self, tmp_path: Path) -> None:
        st = self._store(tmp_path)
        for rid in ("c1", "c2", "c3"):      # run ids sort by time, as new_run_id() makes them
            lease = st.create_run(rid, _records(rid))
            now = time.time()
            st.append(lease, [
                *_started("a", now),
                ("A", "a", 1, "ok", now, now, "", "", ""),
                ("R", "a", 1, "fp-same", "h1", "json", "1", None, 1, None),
                ("E", 4, "a", 1, "running", "succeeded", "", now),
                ("S", "succeeded", "", now),
            ])
            st.release(lease)
            time.sleep(0.01)
        index = st.cache_lookup(["a"])
        assert list(index) == ["fp-same"] and index["fp-same"][0] == "c3"
        assert st.cache_lookup(["a"], exclude_run="c3")["fp-same"][0] == "c2"
        assert st.cache_lookup(["b"]) == {}
        # a resumed run adds successes: the index must show them
        lease = st.take_over("c1")
        now = time.time()
        st.append(lease, [
            *_started("b", now),
            ("A", "b", 1, "ok", now, now, "", "", ""),
            ("R", "b", 1, "fp-b", "h2", "json", "2", None, 1, None),
            ("E", 8, "b", 1, "running", "succeeded", "", now),
        ])
        st.release(lease)
        assert st.cache_lookup(["b"])["fp-b"][:2] == ("c1", "b")

    def test_unknown_run(self, tmp_path: Path) -> None:
        st = self._store(tmp_path)
        try:
            st.get_run("nope")
        except RunNotFoundError:
            return
        raise AssertionError("expected RunNotFoundError")

    def test_lease_fencing(self, tmp_path: Path) -> None:
        st = self._store(tmp_path)
        lease = st.create_run("r2", _records("r2"))
        try:
            st.take_over("r2")
            raise AssertionError("a live driver's run must not be taken over")
        except NotResumableError:
            pass
        st.release(lease)
        new = st.take_over("r2")
        assert new.token > lease.token
        try:
            st.append(lease, [("S", "failed", "stale", time.time())])
            raise AssertionError("a superseded token must be refused")
        except LeaseLostError:
            pass
        st.release(new)
        assert st.get_run("r2").state == "running"

    def test_cancel_request_is_visible(self, tmp_path: Path) -> None:
        st = self._store(tmp_path)
        lease = st.create_run("r3", _records("r3"))
        assert not st.cancel_requested("r3")
        st.request_cancel("r3")
        assert st.cancel_requested("r3")
        st.release(lease)

    def test_large_and_odd_results_round_trip(self, tmp_path: Path) -> None:
        import pyarrow as pa
        st = self._store(tmp_path)
        for value in [list(range(5000)), {1, 2}, pa.table({"x": [1, 2, 3]})]:
            enc = encode(value)
            uri = st.put_blob(enc)
            data = enc.data.decode() if uri is None else None
            back = st.read_blob(enc.kind, data, uri)
            if isinstance(value, pa.Table):
                assert back.equals(value)
            else:
                assert back == value

    def test_runs_are_listed_newest_first(self, tmp_path: Path) -> None:
        st = self._store(tmp_path)
        for rid in ("x1", "x2"):
            lease = st.create_run(rid, _records(rid))
            st.append(lease, [("S", "succeeded", "", time.time())])
            st.release(lease)
            time.sleep(0.01)
        ids = [v.run_id for v in st.list_runs()]
        assert ids[:2] == ["x2", "x1"]
