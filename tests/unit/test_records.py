"""The journal schema: every record kind round-trips, and old journals still resume."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

import ledgerflow
from ledgerflow import pipeline, records, task
from ledgerflow.control import load_module
from ledgerflow.projection import apply
from ledgerflow.records import (
    FORMAT_VERSION,
    KINDS,
    ApprovalDecided,
    ApprovalRequested,
    ArtifactRecorded,
    AttemptEnded,
    DriverHeader,
    LogRecorded,
    ModelCall,
    Notice,
    ResultRecorded,
    RunDefined,
    RunStateChanged,
    StepRecorded,
    Succeeded,
    Takeover,
    TaskCreated,
    ToolCall,
    Transition,
)
from ledgerflow.views import RunView
from ledgerflow_stores.duckdb.store import DuckDBStore


@task
def _inc(x: int) -> int:
    return x + 1


@pipeline
def _chain():
    return _inc(_inc(_inc(0)))


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "format1"

SAMPLES = [
    RunDefined("r1", "p", "flow.py:p", '{"n": 1}', 1.5, '{"executor": "inline"}'),
    DriverHeader(2, 1234, "host", 2.5, FORMAT_VERSION),
    RunStateChanged("failed", "1 task(s) did not succeed", 3.5),
    TaskCreated("m[a]", "m", "m", "[a]", 0, ["src", "other"], "v1", 4.5),
    Transition(7, "m[a]", 1, None, "pending", "", 5.5),
    AttemptEnded("m[a]", 1, "error", None, 6.5, "ValueError", "bad \u00e9\n", "Traceback"),
    ResultRecorded("m[a]", 1, "fp", "hash", "json", "[1, 2]", None, 6, "old-run"),
    ArtifactRecorded("m[a]", 1, "output", "file:///x?y=1", None, {"rows": "3"}),
    Notice(None, None, "stale_driver_rejected", "rejected 3 record(s)", 7.5),
    LogRecorded("m[a]", 1, "output", "hello\n\tworld \u2603\n", 120),
    Takeover(1, 4096, 8.5),
    ApprovalRequested("publish", 0, "ab" * 16, "run", 'target="prod"', {"build": "h1"}, 9.5,
                      None, "fail", ["ana", "bo"], "publishes the index"),
    ApprovalDecided("publish", "ab" * 16, "approved", "ana", "looks right", 10.5),
    StepRecorded("notify", 1, "compose", "json", '"3 items"', "h2"),
    ModelCall("ask", 1, 1, "mock", "m", "OPENAI_KEY", "rq", "rs", 12, 3, 0.25, 0.5, "stop",
              ["search"], 40, 1.0, False, ""),
    ToolCall("ask", 1, 1, "search", "ad", "ana", "ok", "rh", "", True),
    Succeeded(9, "m[a]", 2, 6.5, 7.0, "fp", "hash", "json", "[1, 2]", None, 6, 7.25),
]

#: Format 3's outcome records, and the format 2 records each stands for.
COMPACT = [
    (TaskCreated("m[a]", "m", "m", "[a]", 0, ["src"], "v1", 4.5, 3),
     [TaskCreated("m[a]", "m", "m", "[a]", 0, ["src"], "v1", 4.5),
      Transition(3, "m[a]", 0, None, "pending", "", 4.5)]),
    (TaskCreated("b", "b", "b", None, None, [], "v1", 4.5, 3, "ready", 0, "", 4.75),
     [TaskCreated("b", "b", "b", None, None, [], "v1", 4.5),
      Transition(3, "b", 0, None, "pending", "", 4.5),
      Transition(4, "b", 0, "pending", "ready", "", 4.75)]),
    (Transition(5, "b", 0, "pending", "ready", "", 5.0, "running", 1, "attempt 1", 5.5),
     [Transition(5, "b", 0, "pending", "ready", "", 5.0),
      Transition(6, "b", 1, "ready", "running", "attempt 1", 5.5)]),
    (Succeeded(7, "b", 1, 5.5, 6.0, "fp", "h", "json", "1", None, 1, 6.25),
     [AttemptEnded("b", 1, "ok", 5.5, 6.0, "", "", ""),
      ResultRecorded("b", 1, "fp", "h", "json", "1", None, 1, None),
      Transition(7, "b", 1, "running", "succeeded", "", 6.25)]),
    # format 4: a success that carries its attempt's dispatch (a fan-out child's; a chain
    # link's, made ready just before)
    (Succeeded(8, "c", 1, 5.5, 6.0, "fp", "h", "json", "1", None, 1, 6.25, 5.25),
     [Transition(7, "c", 1, "ready", "running", "attempt 1", 5.25),
      AttemptEnded("c", 1, "ok", 5.5, 6.0, "", "", ""),
      ResultRecorded("c", 1, "fp", "h", "json", "1", None, 1, None),
      Transition(8, "c", 1, "running", "succeeded", "", 6.25)]),
    (Succeeded(9, "d", 3, 5.5, 6.0, None, "h", "json", "1", None, 1, 6.25, 5.25, 5.0),
     [Transition(7, "d", 2, "pending", "ready", "", 5.0),
      Transition(8, "d", 3, "ready", "running", "attempt 3", 5.25),
      AttemptEnded("d", 3, "ok", 5.5, 6.0, "", "", ""),
      ResultRecorded("d", 3, None, "h", "json", "1", None, 1, None),
      Transition(9, "d", 3, "running", "succeeded", "", 6.25)]),
]


def test_every_kind_has_a_sample() -> None:
    assert {records.tag(s) for s in SAMPLES} == set(KINDS)


@pytest.mark.parametrize("record", SAMPLES, ids=[records.tag(s) for s in SAMPLES])
def test_each_kind_encodes_and_decodes(record: records.Record) -> None:
    data = records.encode(record)
    assert data.startswith(b'["' + records.tag(record).encode() + b'",')
    assert records.decode(data) == record
    stands_for = records.expand([record])
    assert records.decode_line(records.encode_line([record, record])) == stands_for * 2


@pytest.mark.parametrize("record,stands_for", COMPACT, ids=[f"{records.tag(r)}{i}" for i, (r, _)
                                                            in enumerate(COMPACT)])
def test_an_outcome_record_reads_as_the_records_it_stands_for(
        record: records.Record, stands_for: list[records.Record]) -> None:
    assert records.expand([record]) == stands_for
    assert records.decode_line(records.encode_line([record])) == stands_for
    # the projection applies it as those records (the DuckDB fold's equality is the
    # store contract's)
    assert apply(RunView("r"), [record]) == apply(RunView("r"), stands_for)


def _journal(tmp_path: Path, run_id: str) -> list[list[Any]]:
    (_, journal), = DuckDBStore(str(tmp_path / "l.duckdb")).journals.archived(run_id)
    return [r for line in gzip.decompress(journal.read_bytes()).splitlines()
            for r in json.loads(line.rsplit(b"\t", 1)[0])]


@pytest.mark.parametrize("lag", ["0", "3600"])
def test_a_run_writes_outcome_records_and_reads_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lag: str) -> None:
    """A chain's task is three records: created (+ pending), ready (+ running), succeeded
    (the first is ready when created). Within the commit lag (format 4), a dispatch no
    commit wrote yet rides in its attempt's success: two records a task."""
    monkeypatch.setenv("LEDGERFLOW_COMMIT_LAG", lag)
    run = _chain.run(store=str(tmp_path / "l.duckdb"), executor="inline").settle()
    recs = _journal(tmp_path, run.run_id)
    kinds = [r[0] for r in recs]
    carried = [r[2] for r in recs if r[0] == "O" and r[-2] is not None]     # its run_ts
    assert kinds.count("T") == 3 and kinds.count("O") == 3
    assert kinds.count("E") == (3 if lag == "0" else 1) and len(carried) == 3 - kinds.count("E")
    assert "A" not in kinds and "R" not in kinds
    events = run.events()
    assert [e["seq"] for e in events] == list(range(1, 13))
    assert [(e["task_key"], e["to_state"]) for e in events if e["task_key"] == "_inc-2"] \
        == [("_inc-2", s) for s in ("pending", "ready", "running", "succeeded")]
    assert [a["outcome"] for a in run.attempts()] == ["ok"] * 3
    assert run.result() == 3


def test_an_old_header_without_a_format_decodes_as_format_1() -> None:
    (h,) = records.decode_line(b'[["H",1,13255,"vm",1796124613.2882085]]')
    assert isinstance(h, DriverHeader) and h.format == 1


@pytest.mark.parametrize("line", [b'[["Q",1]]', b'[["E",1,"a"]]', b'[["E","x"', b"garbage"])
def test_damaged_lines_are_refused(line: bytes) -> None:
    with pytest.raises((msgspec.ValidationError, msgspec.DecodeError)):
        records.decode_line(line)


def test_a_journal_written_by_the_previous_release_is_read_and_resumed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixture: ledgerflow 0.1.0 (format 1) killed while ``square[3]`` ran."""
    shutil.copytree(FIXTURE / "ledger.duckdb.d", tmp_path / "ledger.duckdb.d")
    store = str(tmp_path / "ledger.duckdb")
    monkeypatch.setenv("FORMAT1_MARKS", str(tmp_path))
    (tmp_path / "killed").write_text("yes")
    (run_id,) = [v.run_id for v in ledgerflow.runs(store=store)]
    before = ledgerflow.get_run(run_id, store=store).status()
    assert before.pipeline == "squares" and before.tasks["numbers"].state == "succeeded"
    flow = load_module(FIXTURE / "flow.py")
    run = ledgerflow.resume(run_id, store=store, executor="inline", pipeline=flow.squares)
    assert run.state == "succeeded"
    assert run.result() == sum(x * x for x in range(6))
    view = ledgerflow.get_run(run_id, store=store).status()
    assert view.tasks["numbers"].attempts == 1       # its success was kept, not redone
    assert sorted(view.tasks) == ["numbers", *(f"square[{i}]" for i in range(6)), "total"]
