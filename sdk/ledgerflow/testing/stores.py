"""The run-store contract: behaviour every :class:`~ledgerflow.store.RunStore` must show.

Subclass :class:`StoreContract` and set ``store_name`` (a store your plugin
registers); pytest collects the inherited tests. Stores are built through
the plugin manager, exactly as a run builds them.

Example:
    >>> class TestMyStore(StoreContract):            # doctest: +SKIP
    ...     store_name = "mystore"
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..config import Settings
from ..errors import LeaseLostError, NotResumableError, RunNotFoundError
from ..projection import apply
from ..records import (
    ApprovalDecided,
    ApprovalRequested,
    ArtifactRecorded,
    AttemptEnded,
    DriverHeader,
    ModelCall,
    Notice,
    Record,
    ResultRecorded,
    RunDefined,
    RunStateChanged,
    Succeeded,
    TaskCreated,
    ToolCall,
    Transition,
    expand,
)
from ..results import encode
from ..store import RunStore
from ..views import RunView, event_dict


def run_records(run_id: str, now: float | None = None) -> list[Record]:
    """The records a new run starts with."""
    now = time.time() if now is None else now
    return [RunDefined(run_id, "p", None, "{}", now, "{}"), DriverHeader(1, 1, "host", now, 2),
            RunStateChanged("running", "", now)]


def started(key: str, now: float, seq: int = 1) -> list[Record]:
    """Records of task ``key`` created and running its first attempt."""
    return [TaskCreated(key, key, key, None, None, [], "v1", now),
            Transition(seq, key, 0, None, "pending", "", now),
            Transition(seq + 1, key, 0, "pending", "ready", "", now),
            Transition(seq + 2, key, 1, "ready", "running", "attempt 1", now)]


def _history(now: float) -> list[list[Record]]:
    """Group commits of a run with every kind of record and the awkward cases."""
    t = now
    return [
        [TaskCreated("src", "src", "src", None, None, [], "v1", t),
         TaskCreated("m[a]", "m", "m", "[a]", 0, ["src"], "v2", t),
         TaskCreated("m[b]", "m", "m", "[b]", 1, ["src"], "v2", t),
         TaskCreated("down", "down", "down", None, None, ["m"], "v3", t),
         Transition(1, "src", 0, None, "pending", "", t),
         Transition(2, "m[a]", 0, None, "pending", "", t),
         Transition(3, "m[b]", 0, None, "pending", "", t),
         Transition(4, "down", 0, None, "pending", "", t),
         Transition(5, "src", 0, "pending", "ready", "", t),
         Transition(6, "src", 1, "ready", "running", "attempt 1", t + 1)],
        [AttemptEnded("src", 1, "error", t + 1, t + 2, "ValueError", "boom", "Traceback..."),
         Transition(7, "src", 1, "running", "retry_wait", "ValueError: boom; retry", t + 2),
         Transition(8, "src", 1, "retry_wait", "ready", "retry delay over", t + 3),
         Transition(9, "src", 2, "ready", "running", "attempt 2", t + 3),
         AttemptEnded("src", 2, "ok", t + 3, t + 4, "", "", ""),
         ArtifactRecorded("src", 2, "input", "file:///x", "h-x", {"bytes": "3"}),
         ResultRecorded("src", 2, "fp-src", "h-src", "json", '["a","b"]', None, 9, None),
         Transition(10, "src", 2, "running", "succeeded", "", t + 4),
         Transition(11, "m[a]", 0, "pending", "ready", "", t + 4),
         Transition(12, "m[b]", 0, "pending", "ready", "", t + 4),
         ResultRecorded("m[a]", 0, "fp-a", "h-a", "json", "1", None, 1, "old-run"),
         Transition(13, "m[a]", 0, "ready", "succeeded", "cached", t + 4),
         Transition(14, "m[b]", 1, "ready", "running", "attempt 1", t + 5)],
        [AttemptEnded("m[b]", 1, "timeout", None, t + 6, "TimeoutError", "no result in 1s", ""),
         Notice("m[b]", 1, "late_result_rejected", "rejected", t + 7),
         Transition(15, "m[b]", 1, "running", "failed", "timed out", t + 6),
         Transition(16, "down", 0, "pending", "upstream_failed", "upstream m", t + 6),
         RunStateChanged("failed", "2 task(s) did not succeed", t + 7)],
        # a resume: new driver, lost-free reset of the failed tasks, then success
        [DriverHeader(2, 99, "host2", t + 10, 2),
         RunStateChanged("running", "resumed", t + 10),
         Transition(17, "m[b]", 1, "failed", "pending", "resume: reset", t + 10),
         Transition(18, "down", 0, "upstream_failed", "pending", "resume: reset", t + 10),
         Transition(19, "m[b]", 1, "pending", "ready", "", t + 10),
         Transition(20, "m[b]", 2, "ready", "running", "attempt 2", t + 11),
         AttemptEnded("m[b]", 2, "lost", t + 11, t + 12, "", "driver died", "")],
        [Transition(21, "m[b]", 2, "running", "retry_wait", "lost", t + 12),
         Transition(22, "m[b]", 2, "retry_wait", "ready", "resume", t + 12),
         Transition(23, "m[b]", 3, "ready", "running", "attempt 3", t + 13),
         AttemptEnded("m[b]", 3, "ok", t + 13, t + 14, "", "", ""),
         ResultRecorded("m[b]", 3, "fp-b", "h-b", "json", "2", None, 1, None),
         Transition(24, "m[b]", 3, "running", "succeeded", "", t + 14)],
    ]


def _written(st: RunStore, commits: list[list[Record]], now: float, *,
             taken_over_at: int | None = None) -> list[Record]:
    """Run ``r0`` created in ``st`` and ``commits`` appended (a new driver takes it over
    before commit ``taken_over_at``); every record written, in order."""
    first = run_records("r0", now)
    lease = st.create_run("r0", first)
    for i, records in enumerate(commits):
        if i == taken_over_at:
            st.release(lease)
            lease = st.take_over("r0")
        st.append(lease, records)
    st.release(lease)
    return [*first, *(r for c in commits for r in c)]


def _compact_history(t: float) -> list[list[Record]]:
    """A run's commits in format 3's outcome records: ``a`` fails once, then both succeed."""
    return [
        [TaskCreated("a", "a", "a", None, None, [], "v1", t, 1, "ready", 0, "", t),
         TaskCreated("b", "b", "b", None, None, ["a"], "v1", t, 3),
         Transition(4, "a", 1, "ready", "running", "attempt 1", t + 1)],
        [AttemptEnded("a", 1, "error", t + 1, t + 2, "ValueError", "boom", "Traceback..."),
         Transition(5, "a", 1, "running", "retry_wait", "ValueError: boom; retry", t + 2,
                    "ready", 1, "retry delay over", t + 3),
         Transition(7, "a", 2, "ready", "running", "attempt 2", t + 3)],
        [Succeeded(8, "a", 2, t + 3, t + 4, "fp-a", "h-a", "json", "1", None, 1, t + 4),
         Transition(9, "b", 0, "pending", "ready", "", t + 4, "running", 1, "attempt 1", t + 5),
         Succeeded(11, "b", 1, t + 5, t + 6, "fp-b", "h-b", "json", "2", None, 1, t + 6),
         RunStateChanged("succeeded", "", t + 6)],
    ]


def _dispatch_history(t: float) -> list[list[Record]]:
    """A run's commits with format 4's successes that carry their dispatch: ``a``'s (a
    fan-out child's) folded with its creation, ``b``'s (a chain link's, made ready just
    before) after a takeover, which also runs ``a`` again (its result file gone); ``c``'s
    dispatch is a record of its own (committed before it ran, as for an executor outside
    the driver) with other moves between it and its success; ``x`` fails as it is
    created."""
    return [
        [TaskCreated("a", "a", "a", None, None, [], "v1", t, 1, "ready", 0, "", t),
         TaskCreated("b", "b", "b", None, None, ["a"], "v1", t, 3),
         TaskCreated("x", "x", "x", None, None, ["z"], "v1", t, 4, "upstream_failed", 0,
                     "upstream z did not succeed", t + 0.5),
         TaskCreated("c", "c", "c", None, None, [], "v1", t, 6, "ready", 0, "", t),
         Transition(8, "c", 1, "ready", "running", "attempt 1", t + 0.7)],
        [Succeeded(10, "a", 1, t + 1, t + 2, "fp-a", "h-a", "json", "1", None, 1, t + 2,
                   t + 1),
         Succeeded(11, "c", 1, t + 0.7, t + 2, "fp-c", "h-c", "json", "3", None, 1, t + 2.5)],
        [DriverHeader(2, 99, "host2", t + 3, 4),
         Succeeded(14, "b", 1, t + 4, t + 5, "fp-b", "h-b", "json", "2", None, 1, t + 5,
                   t + 3.5, t + 3),
         Transition(15, "a", 1, "succeeded", "pending", "resume: its result file is gone",
                    t + 6),
         Succeeded(18, "a", 2, t + 7, t + 8, "fp-a", "h-a2", "json", "1", None, 1, t + 8,
                   t + 6.5, t + 6),
         RunStateChanged("failed", "1 task(s) did not succeed", t + 9)],
    ]


class StoreContract:
    """Behaviour every run store must show (see the module docstring)."""

    #: The store name a plugin registers (``ledgerflow_make_store(name=...)``).
    store_name: str = ""

    def store_location(self, tmp_path: Path) -> str:
        """Where the store under test keeps its data (default: a file in ``tmp_path``)."""
        return str(tmp_path / "ledger")

    def make_store(self, tmp_path: Path) -> RunStore:
        """A fresh store, built through the plugin manager."""
        from ..plugins import get_plugin_manager
        settings = Settings(store=self.store_location(tmp_path), store_kind=self.store_name)
        store = get_plugin_manager().hook.ledgerflow_make_store(name=self.store_name,
                                                               settings=settings)
        assert store is not None, f"no plugin builds a store named {self.store_name!r}"
        return store  # type: ignore[no-any-return]

    def test_reads_equal_the_projection_of_the_records(self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        now = time.time()
        all_records = _written(st, _history(now), now, taken_over_at=3)
        expected = apply(RunView("r0"), all_records)
        got = st.get_run("r0")
        _same_view(got, expected)
        assert [a["outcome"] for a in st.attempts("r0")] == ["error", "ok", "timeout", "lost",
                                                             "ok"]
        assert st.attempts("r0", "src")[0]["traceback"] == "Traceback..."
        assert [n["kind"] for n in st.notices("r0")] == ["late_result_rejected"]
        transitions = [r for r in all_records if isinstance(r, Transition)]
        assert st.events("r0") == [event_dict(r) for r in transitions]
        assert st.events("r0", "src") == [event_dict(r) for r in transitions
                                          if r.task_key == "src"]
        arts = [r for r in st.lineage("r0", "src") if r["uri"] == "file:///x"]
        assert arts and arts[0]["attrs"] == {"bytes": "3"}
        head = st.get_run("r0", tasks=False)
        assert (head.state, head.token, head.pipeline) == (expected.state, expected.token, "p")

    def test_outcome_records_read_as_the_records_they_stand_for(self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        now = time.time()
        stands_for = expand(_written(st, _compact_history(now), now))
        expected = apply(RunView("r0"), stands_for)
        _same_view(st.get_run("r0"), expected)
        assert (expected.tasks["a"].state, expected.tasks["a"].attempts) == ("succeeded", 2)
        assert st.events("r0") == [event_dict(r) for r in stands_for
                                   if isinstance(r, Transition)]
        assert [e["seq"] for e in st.events("r0")] == list(range(1, 12))
        assert [(a["task_key"], a["outcome"]) for a in st.attempts("r0")] == [
            ("a", "error"), ("a", "ok"), ("b", "ok")]
        assert st.attempts("r0", "a")[1]["started_at"] == now + 3
        index = st.cache_lookup(["a", "b"])
        assert (index["fp-a"][:3], index["fp-b"][:3]) == (("r0", "a", "h-a"), ("r0", "b", "h-b"))

    def test_successes_that_carry_their_dispatch_read_as_the_moves_they_stand_for(
            self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        now = time.time()
        stands_for = expand(_written(st, _dispatch_history(now), now, taken_over_at=2))
        expected = apply(RunView("r0"), stands_for)
        got = st.get_run("r0")
        _same_view(got, expected)
        assert {k: (r.state, r.started_at, r.ended_at, r.error) for k, r in got.tasks.items()} \
            == {"a": ("succeeded", now + 6.5, now + 8, None),
                "b": ("succeeded", now + 3.5, now + 5, None),
                "c": ("succeeded", now + 0.7, now + 2.5, None),
                "x": ("upstream_failed", None, now + 0.5, "upstream z did not succeed")}
        assert st.events("r0") == [event_dict(r) for r in stands_for
                                   if isinstance(r, Transition)]
        assert [e["seq"] for e in st.events("r0")] == list(range(1, 19))
        assert [(e["task_key"], e["to_state"]) for e in st.events("r0", "b")] == [
            ("b", "pending"), ("b", "ready"), ("b", "running"), ("b", "succeeded")]
        assert [(a["task_key"], a["attempt"]) for a in st.attempts("r0")] == [
            ("a", 1), ("c", 1), ("b", 1), ("a", 2)]
        assert got.tasks["a"].result_hash == "h-a2"

    def test_records_fold_into_task_rows(self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        lease = st.create_run("r1", run_records("r1"))
        now = time.time()
        st.append(lease, [
            *started("a", now),
            AttemptEnded("a", 1, "error", now, now, "ValueError", "boom", ""),
            Transition(4, "a", 1, "running", "retry_wait", "", now),
            Transition(5, "a", 1, "retry_wait", "ready", "", now),
            Transition(6, "a", 2, "ready", "running", "attempt 2", now + 1),
        ])
        row = st.get_run("r1").tasks["a"]
        assert (row.state, row.attempts, row.error) == ("running", 2, "ValueError: boom")
        st.append(lease, [
            AttemptEnded("a", 2, "ok", now, now, "", "", ""),
            ResultRecorded("a", 2, "fp1", "h1", "json", "42", None, 2, None),
            Transition(7, "a", 2, "running", "succeeded", "", now + 2),
            RunStateChanged("succeeded", "", now + 2),
        ])
        st.release(lease)
        view = st.get_run("r1")
        row = view.tasks["a"]
        assert view.state == "succeeded"
        assert (row.state, row.attempts, row.error, row.result_hash) == ("succeeded", 2, None,
                                                                         "h1")
        assert row.started_at == now and row.ended_at == now + 2
        assert st.read_blob(row.result_kind or "", row.result_data, row.result_uri) == 42
        assert [a["outcome"] for a in st.attempts("r1")] == ["error", "ok"]
        assert st.cache_lookup(["a"])["fp1"][0] == "r1"

    def test_cache_index_has_one_entry_per_fingerprint_from_the_newest_run(
            self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        for rid in ("c1", "c2", "c3"):      # run ids sort by time, as new_run_id() makes them
            lease = st.create_run(rid, run_records(rid))
            now = time.time()
            st.append(lease, [
                *started("a", now),
                AttemptEnded("a", 1, "ok", now, now, "", "", ""),
                ResultRecorded("a", 1, "fp-same", "h1", "json", "1", None, 1, None),
                Transition(4, "a", 1, "running", "succeeded", "", now),
                # c1 failed elsewhere (a resume below adds a success); a succeeded run is
                # never taken over again
                RunStateChanged("failed" if rid == "c1" else "succeeded", "", now),
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
            *started("b", now, seq=5),
            AttemptEnded("b", 1, "ok", now, now, "", "", ""),
            ResultRecorded("b", 1, "fp-b", "h2", "json", "2", None, 1, None),
            Transition(8, "b", 1, "running", "succeeded", "", now),
        ])
        st.release(lease)
        assert st.cache_lookup(["b"])["fp-b"][:2] == ("c1", "b")

    def test_lineage_includes_model_and_tool_calls(self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        lease = st.create_run("r5", run_records("r5"))
        now = time.time()
        st.append(lease, [*started("agent", now),
                          ModelCall("agent", 1, 1, "mock", "m-1", "k", "req-h", "resp-h", 3, 4,
                                    0.5, 0.01, "stop", ["t-1"], 0, 0.0, False, "")])
        lease = self._folded(st, lease, "r5")    # one call in the tables, one in the tail
        st.append(lease, [ToolCall("agent", 1, 2, "search", "args-h", "", "ok", "res-h", "",
                                   False)])
        rows = {r["direction"]: r for r in st.lineage("r5", "agent")}
        assert rows["model_call"]["uri"] == "model:mock/m-1"
        assert rows["model_call"]["content_hash"] == "resp-h"
        assert rows["model_call"]["attrs"]["tokens"] == "7"
        assert rows["tool_call"]["uri"] == "tool:search"
        assert rows["tool_call"]["attrs"]["arguments_digest"] == "args-h"
        assert [c["model"] for c in st.model_calls("r5")] == ["m-1"]
        assert [c["tool"] for c in st.tool_calls("r5")] == ["search"]
        st.release(lease)

    def test_approval_decisions_are_the_side_decisions_plus_the_journaled_ones(
            self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        lease = st.create_run("r6", run_records("r6"))
        now = time.time()
        asks = [ApprovalRequested(key, 1, f"dg-{key}", "publish", key, {}, now, None, "fail",
                                  [], "") for key in ("a", "b", "c")]
        st.append(lease, [*started("a", now), *started("b", now, seq=4),
                          *started("c", now, seq=7), *asks,
                          ApprovalDecided("a", "dg-a", "approved", "ann", "ok", now + 1)])
        lease = self._folded(st, lease, "r6")
        # b decided from another process and not journaled yet; c decided and journaled
        st.decide("r6", "b", "dg-b", "rejected", "bob", "no")
        st.decide("r6", "c", "dg-c", "approved", "cy", "fine")
        st.append(lease, [ApprovalDecided("c", "dg-c", "approved", "cy", "fine", now + 2)])
        made = st.approval_decisions("r6")
        assert sorted((d["digest"], d["decision"], d["decided_by"]) for d in made) == [
            ("dg-a", "approved", "ann"), ("dg-b", "rejected", "bob"),
            ("dg-c", "approved", "cy")]
        states = {a["task_key"]: (a["state"], a["decided_by"]) for a in st.approvals("r6")}
        assert states == {"a": ("approved", "ann"), "b": ("rejected", "bob"),
                          "c": ("approved", "cy")}
        st.release(lease)

    @staticmethod
    def _folded(st: RunStore, lease: Any, run_id: str) -> Any:
        """Release and take ``run_id`` over again: what was written is in the tables (a
        store that folds), what is written next is in the unfolded tail."""
        st.release(lease)
        return st.take_over(run_id)

    def test_unknown_run(self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        for read in (lambda: st.get_run("nope"), lambda: st.attempts("nope"),
                     lambda: st.notices("nope"), lambda: st.lineage("nope"),
                     lambda: st.events("nope")):
            try:
                read()
            except RunNotFoundError:
                continue
            raise AssertionError("expected RunNotFoundError")

    def test_lease_fencing(self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        lease = st.create_run("r2", run_records("r2"))
        try:
            st.take_over("r2")
            raise AssertionError("a live driver's run must not be taken over")
        except NotResumableError:
            pass
        st.release(lease)
        new = st.take_over("r2")
        assert new.token > lease.token
        try:
            st.append(lease, [RunStateChanged("failed", "stale", time.time())])
            raise AssertionError("a superseded token must be refused")
        except LeaseLostError:
            pass
        st.release(new)
        assert st.get_run("r2").state == "running"

    def test_cancel_request_is_visible(self, tmp_path: Path) -> None:
        st = self.make_store(tmp_path)
        lease = st.create_run("r3", run_records("r3"))
        assert not st.cancel_requested("r3")
        st.request_cancel("r3")
        assert st.cancel_requested("r3")
        st.release(lease)

    def test_large_and_odd_results_round_trip(self, tmp_path: Path) -> None:
        import pyarrow as pa
        st = self.make_store(tmp_path)
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
        st = self.make_store(tmp_path)
        for rid in ("x1", "x2"):
            lease = st.create_run(rid, run_records(rid))
            st.append(lease, [RunStateChanged("succeeded", "", time.time())])
            st.release(lease)
            time.sleep(0.01)
        ids = [v.run_id for v in st.list_runs()]
        assert ids[:2] == ["x2", "x1"]


def _same_view(got: RunView, expected: RunView) -> None:
    """Assert two views agree on everything a reader can see."""
    fields: list[str] = ["state", "reason", "ended_at", "token", "max_seq", "pipeline",
                         "params", "created_at"]
    for f in fields:
        assert getattr(got, f) == getattr(expected, f), (f, getattr(got, f),
                                                         getattr(expected, f))
    assert set(got.tasks) == set(expected.tasks)
    for key, exp in expected.tasks.items():
        row: Any = got.tasks[key]
        for f in exp.__slots__:
            assert getattr(row, f) == getattr(exp, f), (key, f, getattr(row, f),
                                                        getattr(exp, f))
