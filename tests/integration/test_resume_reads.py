"""How much ``pipeline resume`` reads: store objects, ledger opens and run reads.

The resume hands on the view it read (the CLI's check of the run, the
control API's refusal check, the runner's prior rows), so each layer does not
open the ledger and read the run again. Counted in process on a real DuckDB
ledger, with counters around the store's methods.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerflow.cli import main
from ledgerflow_stores.duckdb.connection import Ledger
from ledgerflow_stores.duckdb.store import DuckDBStore

FLOW = """
import os
from ledgerflow import task, pipeline

@task
def a(n: int) -> int:
    return n

@task
def b(x: int) -> int:
    if not os.path.exists(os.environ["FLAG_FILE"]):
        raise ValueError("not yet")
    return x + 1

@task
def c(x: int) -> int:
    return x * 2

@pipeline
def eight(n: int = 17):
    first = a(n)
    left = [c(first) for _ in range(3)]
    return b(first), left, [c(x) for x in left[:2]], c(b(first))
"""

COUNTED = ("__init__", "get_run", "frontier", "task_rows", "_tail", "approvals",
           "approval_decisions", "steps", "cache_lookup", "recover", "take_over")


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    seen: collections.Counter[str] = collections.Counter()

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in COUNTED:
        fn = getattr(DuckDBStore, name, None)
        if fn is not None:
            monkeypatch.setattr(DuckDBStore, name, counted(name, fn))
    real_open = Ledger._open

    def opened(self: Ledger, write: bool) -> Any:
        seen["open " + ("write" if write else "read")] += 1
        return real_open(self, write)

    monkeypatch.setattr(Ledger, "_open", opened)
    yield seen


def _cli(args: list[str]) -> int:
    try:
        main.main(args, standalone_mode=False)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _failed_then_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                         counts: collections.Counter[str],
                         capsys: pytest.CaptureFixture[str]) -> str:
    """Run the 8-task pipeline (b fails), let b succeed, and resume it counted."""
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    flag = tmp_path / "flag"
    monkeypatch.setenv("FLAG_FILE", str(flag))
    ledger = str(tmp_path / "ledger.duckdb")
    assert _cli(["run", str(flow), "--executor", "inline", "--store", ledger]) == 1
    run_id = capsys.readouterr().out.split()[1]
    flag.write_text("ok")
    counts.clear()
    assert _cli(["resume", run_id, "--executor", "inline", "--store", ledger]) == 0
    return capsys.readouterr().out


def test_resume_reads_the_run_once_and_opens_the_ledger_a_few_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        counts: collections.Counter[str], capsys: pytest.CaptureFixture[str]) -> None:
    out = _failed_then_resumed(tmp_path, monkeypatch, counts, capsys)
    assert "resuming" in out and "succeeded" in out
    seen = sorted(counts.items())
    assert counts["__init__"] == 1, seen        # one store object (2 before)
    # the run before the takeover (a frontier read: its rows are the prior rows, the
    # successes kept by key only) and the closing table
    assert counts["frontier"] == 1 and counts["get_run"] == 1, seen   # get_run 4 before
    # the kept successes whose results b and the c after it need: one read
    assert counts["task_rows"] == 1, seen
    # read: the run; read (after its pipeline's import, the file free meanwhile): the
    # cache and kept results; write: the takeover; write: the fold at release; read:
    # the closing table (8 before; the runner's signals are not read: it has none)
    assert counts["open read"] + counts["open write"] <= 5, seen
    assert counts["take_over"] == 1 and counts["recover"] == 1, seen
    assert counts["_tail"] <= 6, seen           # 10 before


def test_resume_of_a_pipeline_without_gates_or_steps_reads_none_of_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        counts: collections.Counter[str], capsys: pytest.CaptureFixture[str]) -> None:
    _failed_then_resumed(tmp_path, monkeypatch, counts, capsys)
    assert counts["approvals"] + counts["approval_decisions"] + counts["steps"] == 0, \
        sorted(counts.items())
