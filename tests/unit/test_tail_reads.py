"""A live run's journal tail is decoded once per read block, and again once it grew."""

from __future__ import annotations

from typing import Any

from ledgerflow import pipeline, store, task
from ledgerflow.records import Notice
from ledgerflow_stores.duckdb import DuckDBStore, FoldPolicy, journal


@task
def one(i: int) -> int:
    return i


@pipeline
def few(n: int):
    return one.map(list(range(n)))


def _counting(monkeypatch: Any) -> list[str]:
    """Count the segment reads of journal.read_records (by file name)."""
    seen: list[str] = []
    plain = journal.read_records

    def counted(path: Any, start: int) -> Any:
        seen.append(path.name)
        return plain(path, start)
    monkeypatch.setattr(journal, "read_records", counted)
    return seen


def test_a_status_decodes_a_live_runs_tail_once(tmp_path, monkeypatch) -> None:
    st = DuckDBStore(str(tmp_path / "l.duckdb"),
                     policy=FoldPolicy(fold_at_release=False, interval=3600))
    run = few.run(n=5, store=st, executor="inline")          # all of it in the journal
    seen = _counting(monkeypatch)
    with store.reading(st):
        view = st.get_run(run.run_id)
        assert st.approvals(run.run_id) == [] and st.notices(run.run_id) == []
    assert len(seen) == 1                     # one segment, decoded once for three reads
    assert view.state == "succeeded" and len(view.tasks) == 5
    st.get_run(run.run_id)
    st.notices(run.run_id)
    assert len(seen) == 3                     # outside a block, each read decodes


def test_a_segment_that_grew_in_the_block_is_read_again(tmp_path, monkeypatch) -> None:
    st = DuckDBStore(str(tmp_path / "l.duckdb"),
                     policy=FoldPolicy(fold_at_release=False, interval=3600))
    run = few.run(n=3, store=st, executor="inline")
    seen = _counting(monkeypatch)
    with store.reading(st):
        assert st.notices(run.run_id) == []
        (segment,) = st.journals.segments(run.run_id)
        with open(segment[1], "ab") as fh:          # what a live driver commits meanwhile
            fh.write(journal.frame([Notice(None, None, "note", "written later", 1.0)]))
        assert [n["message"] for n in st.notices(run.run_id)] == ["written later"]
        assert [n["message"] for n in st.notices(run.run_id)] == ["written later"]
    assert len(seen) == 2                     # read again once it grew, then not


def test_a_segment_gone_in_the_block_reads_as_empty(tmp_path) -> None:
    # (archived meanwhile by another process: the store then finds it by its new name)
    tails = journal.TailReads()
    with tails.block():
        assert tails.read(tmp_path / "gone.1.jsonl", 0) == ([], None)
