"""A released run's fold happens behind its return: the run is durable and readable at
once, its SQL tables catch up on a thread the interpreter waits for at exit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

import ledgerflow
from ledgerflow import pipeline, task
from ledgerflow.errors import StoreError
from ledgerflow_stores.duckdb import DuckDBStore, FoldPolicy, behind
from ledgerflow_stores.duckdb.fold import Fold
from ledgerflow_stores.duckdb.journal import Journals

ROOT = Path(__file__).resolve().parents[2]
BEHIND = FoldPolicy(behind=True)


@task
def one(i: int) -> int:
    return i * 2


@task
def sometimes(i: int, flag: str) -> int:
    if not Path(flag).exists():
        raise ValueError("not yet")
    return i


@pipeline
def few(n: int):
    return one.map(list(range(n)))


@pipeline
def flaky(flag: str):
    return sometimes(1, flag)


def _table_tasks(path: Path, run_id: str) -> list[tuple[str, str]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT task_key, state FROM tasks WHERE run_id = ? "
                           "ORDER BY task_key", [run_id]).fetchall()
    finally:
        con.close()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Held shut, a fold behind a release waits for it to open; a fold on the thread
    that released (not behind) goes on at once, so the test shows it, never hangs."""
    shut = threading.Event()
    caller = threading.current_thread()
    real = DuckDBStore._fold_released

    def gated(self: DuckDBStore, lease: Any, behind: bool = False) -> None:
        if threading.current_thread() is not caller:
            shut.wait()
        real(self, lease, behind)
    monkeypatch.setattr(DuckDBStore, "_fold_released", gated)
    return shut


def test_a_run_returns_before_its_fold_and_settle_waits_for_it(
        tmp_path: Path, gate: threading.Event) -> None:
    path = tmp_path / "l.duckdb"
    st = DuckDBStore(str(path), policy=BEHIND)
    gate.set()
    few.run(n=1, store=st, executor="inline").settle()     # the file exists
    gate.clear()
    run = few.run(n=3, store=st, executor="inline")
    assert run.state == "succeeded"
    assert _table_tasks(path, run.run_id) == []        # not folded yet...
    assert {t.state for t in run.status().tasks.values()} == {"succeeded"}  # ...but read
    assert run.result() == [0, 2, 4]
    gate.set()
    run.settle()
    assert _table_tasks(path, run.run_id) == [(f"one[{i}]", "succeeded") for i in range(3)]
    assert st.journals.archived(run.run_id)        # and its journal was archived after


def test_a_ledger_removed_right_after_its_run_returns_is_not_made_again(
        tmp_path: Path, gate: threading.Event, caplog: pytest.LogCaptureFixture) -> None:
    """A temporary folder removed at the end of its block, its run's fold still behind:
    the fold creates no new ledger there (nor the folder), and says nothing is wrong."""
    folder = tmp_path / "tmp"
    path = folder / "l.duckdb"
    st = DuckDBStore(str(path), policy=BEHIND)
    gate.set()
    few.run(n=1, store=st, executor="inline").settle()     # the ledger exists, and is used
    gate.clear()
    run = few.run(n=3, store=st, executor="inline")
    assert run.state == "succeeded"
    shutil.rmtree(folder)           # what TemporaryDirectory's exit does
    caplog.set_level("DEBUG", logger="ledgerflow")
    gate.set()
    run.settle()
    assert not folder.exists()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert "is gone, nothing to fold" in caplog.text


@pytest.mark.parametrize("removed", [True, False])
def test_a_fold_behind_that_fails_warns_unless_its_ledger_went_meanwhile(
        tmp_path: Path, gate: threading.Event, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch, removed: bool) -> None:
    path = tmp_path / "l.duckdb"
    st = DuckDBStore(str(path), policy=BEHIND)
    gate.set()
    few.run(n=1, store=st, executor="inline").settle()     # the ledger exists
    gate.clear()

    def failing(self: Fold, *args: Any, **kwargs: Any) -> bool:
        if removed:         # the folder went while the fold ran
            path.unlink()
        raise StoreError(f"cannot open ledger {path}: No such file or directory")
    monkeypatch.setattr(Fold, "run", failing)
    run = few.run(n=2, store=st, executor="inline")
    caplog.set_level("DEBUG", logger="ledgerflow")
    gate.set()
    run.settle()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if removed:
        assert not warned and "is gone, nothing to fold" in caplog.text
    else:
        assert len(warned) == 1 and "folding its journal" in warned[0]


def test_the_first_run_of_a_new_ledger_makes_its_file_before_it_returns(
        tmp_path: Path, gate: threading.Event) -> None:
    """No fold is behind it, so a folder removed as the run returns stays removed."""
    folder = tmp_path / "tmp"
    path = folder / "l.duckdb"
    run = few.run(n=2, store=DuckDBStore(str(path), policy=BEHIND), executor="inline")
    assert len(_table_tasks(path, run.run_id)) == 2      # at once, the gate still shut
    shutil.rmtree(folder)
    gate.set()
    run.settle()
    assert not folder.exists()


def test_with_the_fold_before_return_the_tables_hold_the_run_at_once(
        tmp_path: Path, gate: threading.Event) -> None:
    gate.set()
    path = tmp_path / "l.duckdb"
    st = DuckDBStore(str(path), policy=FoldPolicy(behind=False))
    run = few.run(n=2, store=st, executor="inline")
    assert len(_table_tasks(path, run.run_id)) == 2      # at once, no settle


def test_a_process_that_exits_right_after_its_run_leaves_the_tables_current(
        tmp_path: Path) -> None:
    path = tmp_path / "l.duckdb"
    script = ("import sys\n"
              "from tests.unit.test_fold_behind import few\n"
              "print(few.run(n=4, store=sys.argv[1], executor='inline').run_id)\n")
    env = {**os.environ, "LEDGERFLOW_FOLD_BEHIND": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "sdk"), str(ROOT / "plugins")])}
    out = subprocess.run([sys.executable, "-c", script, str(path)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    run_id = out.stdout.split()[-1]
    assert len(_table_tasks(path, run_id)) == 4
    assert not list((Path(str(path) + ".d") / "runs").glob(f"{run_id}/lease"))


def test_a_takeover_right_after_a_failed_run_waits_for_its_fold(
        tmp_path: Path, gate: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    st = DuckDBStore(str(tmp_path / "l.duckdb"), policy=BEHIND)
    flag = tmp_path / "flag"
    gate.set()
    few.run(n=1, store=st, executor="inline").settle()
    gate.clear()
    run = flaky.run(flag=str(flag), store=st, executor="inline")
    assert run.state == "failed"        # its fold (and the lease's removal) held back
    real = behind.settle

    def settle(location: str, run_id: str | None = None) -> None:
        gate.set()          # a wait for the fold lets it go, then waits for it
        real(location, run_id)
    monkeypatch.setattr(behind, "settle", settle)
    try:
        lease = st.take_over(run.run_id)    # not "still being driven by pid <this one>"
    finally:
        gate.set()
    st.release(lease)
    flag.write_text("ok")
    again = ledgerflow.resume(run.run_id, store=st, pipeline=flaky, executor="inline")
    assert again.state == "succeeded"


def test_a_cache_lookup_in_a_read_block_does_not_wait_for_a_fold_that_needs_the_file(
        tmp_path: Path, gate: threading.Event) -> None:
    from ledgerflow.store import reading
    st = DuckDBStore(str(tmp_path / "l.duckdb"), policy=BEHIND)
    gate.set()
    first = few.run(n=2, store=st, executor="inline").settle()
    gate.clear()
    run = few.run(n=3, store=st, executor="inline")
    with reading(st):       # holds the file for this thread: the fold behind waits for it
        gate.set()
        hits = st.cache_lookup(["one"])        # returns (the fold cannot go first)
        assert {h[0] for h in hits.values()} == {first.run_id}
    run.settle()
    assert run.run_id in {h[0] for h in st.cache_lookup(["one"]).values()}   # now in


def test_settle_from_a_fold_behinds_own_thread_waits_for_none(tmp_path: Path) -> None:
    seen: list[bool] = []

    def work() -> None:
        behind.settle("somewhere", "r1")      # its own thread: returns at once
        seen.append(True)
    behind.start("somewhere", "r1", work)
    behind.settle("somewhere")
    assert seen == [True]       # (a thread that joined itself would have raised first)


def test_an_archive_leaves_a_later_drivers_segment_live(tmp_path: Path) -> None:
    journals = Journals(tmp_path / "journals")
    journals.folder.mkdir()
    for token in (1, 2):
        journals.path("r", token).write_bytes(b"x\n")
    journals.archive("r", upto=1)
    assert [t for t, _ in journals.archived("r")] == [1]
    assert [t for t, _ in journals.segments("r")] == [2]


def test_a_bad_fold_behind_setting_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "LEDGERFLOW_FOLD_BEHIND": "sometimes"}
    out = subprocess.run([sys.executable, "-m", "ledgerflow", "runs", "--store",
                          str(tmp_path / "l.duckdb")], env=env, capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert "LEDGERFLOW_FOLD_BEHIND must be 0 or 1" in out.stderr
    assert not (tmp_path / "l.duckdb").exists()


@pytest.mark.parametrize("value, behind_", [("0", False), ("1", True), ("", True)])
def test_the_fold_behind_setting(monkeypatch: pytest.MonkeyPatch, value: str,
                                 behind_: bool) -> None:
    monkeypatch.setenv("LEDGERFLOW_FOLD_BEHIND", value)
    assert FoldPolicy.from_env().behind is behind_


def test_a_release_within_a_read_block_folds_before_it_returns(tmp_path: Path) -> None:
    from ledgerflow.store import reading
    st = DuckDBStore(str(tmp_path / "l.duckdb"), policy=BEHIND)
    run = flaky.run(flag=str(tmp_path / "flag"), store=st, executor="inline").settle()
    with reading(st):       # this thread holds the file: a fold behind could not get it
        st.release(st.take_over(run.run_id))
        st.release(st.take_over(run.run_id))    # its lease went with that fold, here
    assert st.get_run(run.run_id, tasks=False).driver_alive is False
