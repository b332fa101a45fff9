"""``resume --plan``: the summary read of only the tasks a resume may change says what
the plan of every row says."""

from __future__ import annotations

import os
import subprocess
import sys

from ledgerflow import pipeline, task
from ledgerflow.control import plan_resume, plan_summary
from ledgerflow_stores.duckdb import DuckDBStore, FoldPolicy
from tests.unit.test_duckdb_store import maybe, total


@task
def blob(i: int) -> bytes:
    return bytes([i]) * 10          # not JSON: kept in a result file, not in the row


@pipeline
def mixed(n: int):
    return [total(maybe.map(list(range(n)))), blob.map(list(range(3)))]


def _from_rows(rows: list[tuple[str, str, str]]) -> tuple[dict[str, int], list]:
    counts: dict[str, int] = {}
    for _, action, _ in rows:
        counts[action] = counts.get(action, 0) + 1
    return counts, [r for r in rows if r[1] != "reuse"]


def test_the_summary_read_plans_what_every_row_plans(tmp_path) -> None:
    path = str(tmp_path / "l.duckdb")
    run = mixed.run(n=200, store=path, executor="inline")
    st = DuckDBStore(path)
    view = st.get_run(run.run_id)
    gone = view.tasks["blob[1]"].result_uri
    assert gone is not None
    os.remove(st.result_path(gone))         # a success whose result file is lost
    found = st.unsettled(run.run_id)
    assert found is not None
    part, kept = found
    assert kept == 200 - 3                  # maybe's successes: their result is in the row
    assert sorted(part.tasks) == ["blob[0]", "blob[1]", "blob[2]", "maybe[0]", "maybe[194]",
                                  "maybe[97]", "total"]
    counts, changed = plan_summary(run.run_id, store=path)
    assert (counts, changed) == _from_rows(plan_resume(run.run_id, store=path))
    assert counts == {"rerun": 5, "reuse": 199}
    assert ("blob[1]", "rerun", f"its result file {gone} is gone") in changed


def test_an_unfolded_journal_is_planned_from_every_row(tmp_path) -> None:
    st = DuckDBStore(str(tmp_path / "u.duckdb"),
                     policy=FoldPolicy(fold_at_release=False, interval=3600))
    run = mixed.run(n=20, store=st, executor="inline")
    assert st.unsettled(run.run_id) is None      # the tail is only in the journal
    assert plan_summary(run.run_id, store=st) == _from_rows(plan_resume(run.run_id, store=st))


def test_pipeline_resume_plan_prints_the_counts_and_what_changes(tmp_path) -> None:
    path = str(tmp_path / "l.duckdb")
    run = mixed.run(n=200, store=path, executor="inline")
    out = subprocess.run([sys.executable, "-m", "ledgerflow", "resume", run.run_id, "--plan",
                          "--store", path], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"resume plan for {run.run_id}: 4 rerun, 200 reuse"
    assert lines[1:4] == ["  rerun  maybe[0]: was failed: reset with a fresh attempt budget",
                         "  rerun  maybe[97]: was failed: reset with a fresh attempt budget",
                         "  rerun  maybe[194]: was failed: reset with a fresh attempt budget"]
    assert lines[4].startswith("  rerun  total: was upstream_failed") and len(lines) == 5


def test_a_run_with_journal_damage_is_planned_from_every_row(tmp_path) -> None:
    import duckdb

    path = str(tmp_path / "l.duckdb")
    run = mixed.run(n=20, store=path, executor="inline").settle()
    con = duckdb.connect(path)      # what a fold records when a journal line is unreadable
    con.execute("INSERT INTO journal_damage VALUES (?, 1, 0, 'checksum mismatch', 0)",
                [run.run_id])
    con.close()
    assert DuckDBStore(path).unsettled(run.run_id) is None
    assert plan_summary(run.run_id, store=path) == _from_rows(plan_resume(run.run_id, store=path))
