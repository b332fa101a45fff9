"""``pipeline status`` of a big run: summed in SQL, the same table as from every row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerflow import pipeline, task
from ledgerflow.cli.render import dumps, run_dumps, run_json, summary
from ledgerflow.views import RunView
from ledgerflow_stores.duckdb import DuckDBStore, FoldPolicy
from tests.unit.test_duckdb_store import maybe, total


@task
def square(i: int) -> int:
    return i * i


@pipeline
def big(n: int, salt: int = 0):
    return [total(maybe.map(list(range(n)))), square.map(list(range(salt, salt + n)))]


def _table(view, capsys) -> str:
    summary(view, all_rows=True)
    return capsys.readouterr().out


def _same_summary(summed: RunView | None, full: RunView, capsys) -> str:
    """Check ``summed`` (300 ``maybe``, one ``total``, 300 ``square`` half cached) says
    what the full read ``full`` says; return its table."""
    assert summed is not None and not summed.tasks
    assert summed.counts() == full.counts()
    assert summed.counts()["failed"] == 4 and summed.counts()["upstream_failed"] == 1
    assert [(g.name, g.count, g.cached) for g in summed.groups or []] == [
        ("maybe", 300, 296), ("total", 1, 0), ("square", 300, 150)]
    assert summed.first_failure is not None
    assert summed.first_failure.key == full.root_causes()[0].key
    table = _table(summed, capsys)
    assert table == _table(full, capsys)
    return table


def test_a_big_run_summed_in_sql_shows_what_its_rows_show(tmp_path, capsys) -> None:
    path = str(tmp_path / "l.duckdb")
    big.run(n=300, store=path, executor="inline")
    run = big.run(n=300, salt=150, store=path, executor="inline").settle()   # half cached
    st = DuckDBStore(path)
    summed = st.summarize(run.run_id, min_tasks=500)
    full = st.get_run(run.run_id, upstream=False)
    table = _same_summary(summed, full, capsys)
    assert "root cause: maybe[0]: ValueError: item 0 (and 3 more)" in table


def test_small_runs_and_unfolded_journals_are_read_row_by_row(tmp_path) -> None:
    path = str(tmp_path / "l.duckdb")
    run = big.run(n=20, store=path, executor="inline").settle()
    assert DuckDBStore(path).summarize(run.run_id, min_tasks=500) is None
    assert DuckDBStore(path).summarize(run.run_id, min_tasks=10) is not None
    unfolded = str(tmp_path / "u.duckdb")
    st = DuckDBStore(unfolded, policy=FoldPolicy(fold_at_release=False, interval=3600))
    run = big.run(n=20, store=st, executor="inline")
    assert st.summarize(run.run_id, min_tasks=10) is None      # the tables lack the run


@pytest.mark.parametrize("bites", [1, 2])
def test_a_live_run_is_summed_in_sql_with_its_journal_tail_on_top(tmp_path, capsys,
                                                                  monkeypatch,
                                                                  bites: int) -> None:
    """A run whose journal the tables hold only in part (a live run between folds):
    the tasks its tail names are summed from their rows, the rest in SQL."""
    path = str(tmp_path / "l.duckdb")
    big.run(n=300, store=path, executor="inline")
    monkeypatch.setenv("LEDGERFLOW_COMMIT_LAG", "0")    # a journal line a task: many batches
    st = DuckDBStore(path, policy=FoldPolicy(fold_at_release=False, interval=3600,
                                             batch_bytes=4096, bite_bytes=4096))
    run = big.run(n=300, salt=150, store=st, executor="inline")
    # a bite of 4 KB folds one batch (64 KB or more: its creation's line, then tasks)
    assert st.fold_run(run.run_id, max_bytes=4096 * bites)      # more is left
    summed = st.summarize(run.run_id, min_tasks=500)
    full = st.get_run(run.run_id, upstream=False)
    _same_summary(summed, full, capsys)
    assert summed is not None and summed.state == full.state == "failed"  # (in the tail)


@pytest.mark.timeout(120)
def test_pipeline_status_of_a_big_run(tmp_path) -> None:
    path = str(tmp_path / "l.duckdb")
    run = big.run(n=300, store=path, executor="inline")
    out = subprocess.run([sys.executable, "-m", "ledgerflow", "status", run.run_id,
                          "--store", path], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "│ maybe  │ 300   │ 4 failed, 296 succeeded" in out.stdout
    assert "tasks: 4 failed, 596 succeeded, 1 upstream_failed" in out.stdout


@task
def greet(name: str) -> str:
    if name != "ana":
        raise ValueError(f"no greeting for {name}")
    return f"hello {name}"


@pipeline
def greetings():
    return [greet("ana"), greet("zoë")]


def test_a_runs_json_is_the_same_text_from_msgspec(tmp_path) -> None:
    # status/run --json write the run's document with msgspec: the same bytes as
    # json.dumps for failures, cached tasks and root causes, and for text other than
    # ASCII too (json.dumps escapes it: that document goes through json.dumps)
    path = str(tmp_path / "l.duckdb")
    big.run(n=20, store=path, executor="inline")
    cached = DuckDBStore(path).get_run(big.run(n=20, salt=10, store=path,
                                               executor="inline").run_id)
    named = DuckDBStore(path).get_run(greetings.run(store=path, executor="inline").run_id)
    assert "zoë" in str([t.error for t in named.tasks.values()])
    for view in (cached, named):
        text = run_dumps(view)
        assert text == dumps(run_json(view))
        assert text.isascii()
    assert json.loads(run_dumps(cached))["root_cause"]["key"] == "maybe[0]"


def test_a_live_run_with_a_damaged_tail_is_read_row_by_row(tmp_path, monkeypatch) -> None:
    # a tail the summary cannot trust is left to the full read, which says where the
    # damage is (pipeline status prints it)
    path = str(tmp_path / "l.duckdb")
    monkeypatch.setenv("LEDGERFLOW_COMMIT_LAG", "0")
    st = DuckDBStore(path, policy=FoldPolicy(fold_at_release=False, interval=3600,
                                             batch_bytes=4096, bite_bytes=4096))
    run = big.run(n=300, store=st, executor="inline")
    assert st.fold_run(run.run_id, max_bytes=4096)              # more is left
    (segment,) = st.journals.segments(run.run_id)
    lines = segment[1].read_bytes().splitlines(keepends=True)
    lines[-3] = b"this is not a journal line\n"                 # in the unfolded part
    segment[1].write_bytes(b"".join(lines))
    assert st.summarize(run.run_id, min_tasks=500) is None
    assert "damaged" in (st.get_run(run.run_id, upstream=False).damage or "")


@task
def shout(name: str) -> str:
    if name.startswith(":fire:"):
        raise ValueError(f"{name} is on :fire:")
    return name.upper()


@pipeline
def shouting(names: list[str]):
    return shout.map(names)


def test_keys_and_errors_are_shown_as_written_not_as_emoji(tmp_path, capsys) -> None:
    # an item key or an error holding rich's emoji codes (":rocket:") is text, not 🚀
    run = shouting.run(names=[":rocket:.txt", ":fire:.md"], store=str(tmp_path / "l.duckdb"),
                       executor="inline", fail_fast=False)
    table = _table(run.status(), capsys)
    assert ":rocket:.txt" in table and ":fire:.md is on :fire:" in table, table
    assert "🚀" not in table and "🔥" not in table, table


@task
def listing(n: int) -> list[int]:
    return list(range(n))


@pipeline
def gathered(n: int = 3):
    return total(square.map(listing(n)))


def _task_column(text: str) -> list[str]:
    return [line.split("│")[1].strip() for line in text.splitlines()
            if line.startswith("│") and "│" in line[1:]]


def test_status_explain_and_the_run_list_each_task_after_what_it_reads(tmp_path) -> None:
    # the gathering task is made before the fan-out's items (they are made as the run
    # goes), but it is listed after them, as the run's live lines show it
    path = str(tmp_path / "l.duckdb")
    flow = tmp_path / "flow.py"
    flow.write_text("from tests.unit.test_status_summary import gathered\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run([sys.executable, "-m", "ledgerflow", "run", f"{flow}:gathered",
                          "--store", path, "--executor", "inline"], capture_output=True,
                         text=True, check=False, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    order = ["listing", "square[0]", "square[1]", "square[2]", "total"]
    assert _task_column(ran.stdout) == order, ran.stdout
    run_id = DuckDBStore(path).list_runs()[0].run_id
    assert list(DuckDBStore(path).get_run(run_id).tasks)[:2] == ["listing", "total"]
    status = subprocess.run([sys.executable, "-m", "ledgerflow", "status", run_id,
                             "--store", path], capture_output=True, text=True, check=False)
    assert status.returncode == 0, status.stderr
    assert _task_column(status.stdout) == order, status.stdout
    explain = subprocess.run([sys.executable, "-m", "ledgerflow", "explain", run_id,
                              "--store", path], capture_output=True, text=True, check=False)
    assert explain.returncode == 0, explain.stderr
    keys = [line.split()[0] for line in explain.stdout.splitlines() if line.startswith("  ")]
    assert keys == order, explain.stdout


def test_status_all_of_a_big_run_lists_every_task_in_plain_columns(tmp_path) -> None:
    # above 500 rows --all prints aligned lines, not a rich table
    path = str(tmp_path / "l.duckdb")
    run = big.run(n=300, store=path, executor="inline").settle()
    out = subprocess.run([sys.executable, "-m", "ledgerflow", "status", run.run_id,
                          "--store", path, "--all"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"run {run.run_id} (big): failed")
    assert lines[1].split() == ["task", "state", "attempts", "duration", "error"]
    rows = [line.split()[0] for line in lines[2:] if not line.startswith(("tasks:", "root"))]
    assert len(rows) == len(set(rows)) == 601
    assert rows.index("total") > max(rows.index(f"maybe[{i}]") for i in range(300))
    failed = [line for line in lines if line.startswith("maybe[0] ")]
    assert failed and "failed" in failed[0] and "ValueError: item 0" in failed[0]
    assert "tasks: 4 failed, 596 succeeded, 1 upstream_failed" in out.stdout
    assert "┃" not in out.stdout
