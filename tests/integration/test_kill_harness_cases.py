"""Cases the kill -9 harness found, made deterministic (issue 31): each builds the state
a kill or a race left and checks what a user then sees.

* Two resumes of a dead run: one read the run, the other took it over and drove it (to
  its end) before the first took it over. When that read did not come from the store
  object that takes the run over (``ledgerflow.resume(run_id, view=...)``), the first
  resume drove the run again from its old rows (a task ran again, attempt numbers were
  reused), or, if the read was made while the other drove, exited 70 (``cannot go on
  resume from 'succeeded'``) leaving a live journal segment and a bumped token on the
  succeeded run. The view is the prior only if the takeover's token follows its own, and
  the takeover refuses a run that succeeded.
* A driver whose fold at release found the file locked past the lock timeout ended 0 in
  silence, its SQL tables behind ``pipeline status``: it says so now.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from ledgerflow import control as api
from ledgerflow.errors import NotResumableError
from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

FLOW = """
import os, subprocess, sys, time
from pathlib import Path
from ledgerflow import pipeline, task

SIDE = Path(os.environ["SIDE"])

@task
def first() -> int:
    with open(SIDE / "first.count", "a") as fh:
        fh.write("ran\\n")
    return 1

@task
def second(x: int) -> int:
    with open(SIDE / "second.count", "a") as fh:
        fh.write("ran\\n")
    if not (SIDE / "fixed").exists():
        raise RuntimeError("not yet")
    while os.environ.get("WAIT") and not (SIDE / "go").exists():
        time.sleep(0.02)
    if os.environ.get("HOLDER"):        # another process holds the ledger from now on
        subprocess.Popen([sys.executable, os.environ["HOLDER"]], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)     # (the test reads the driver's pipes)
        while not (SIDE / "holding").exists():
            time.sleep(0.02)
    return x + 1

@pipeline
def flow():
    return second(first())
"""

#: holds the ledger file open read-only (as a user's SQL session would) until SIDE/go
HOLDER = """
import os, time
from pathlib import Path
import duckdb
side = Path(os.environ["SIDE"])
while True:
    try:
        con = duckdb.connect(os.environ["LEDGER"], read_only=True)
        break
    except duckdb.Error:
        time.sleep(0.01)
(side / "holding").write_text("")
while not (side / "go").exists():
    time.sleep(0.02)
con.close()
(side / "released").write_text("")
"""


def _cli(env: dict[str, str], store: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args, "--store", store],
                          capture_output=True, text=True, env=env, timeout=120)


def _failed_run(tmp: Path) -> tuple[str, str, dict[str, str], Path]:
    """A run whose second task failed; the fix is in (``fixed``), so a resume succeeds."""
    (tmp / "flow.py").write_text(FLOW)
    side = tmp / "side"
    side.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env["SIDE"] = str(side)
    store = str(tmp / "ledger.duckdb")
    first = _cli(env, store, "run", str(tmp / "flow.py"))
    assert first.returncode == 1, first.stderr
    (side / "fixed").write_text("")
    return first.stdout.split()[1], store, env, side


def test_a_resume_from_a_read_older_than_another_drivers_whole_drive_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, store, env, side = _failed_run(tmp_path)
    monkeypatch.setenv("SIDE", str(side))
    read_before = api.open_ledger(store).get_run(run_id)       # failed, nobody drives it
    assert read_before.state == "failed" and read_before.driver_alive is False
    other = _cli(env, store, "resume", run_id)                  # another process finishes it
    assert other.returncode == 0, other.stderr
    with pytest.raises(NotResumableError, match="already succeeded") as refused:
        api.resume(run_id, store=store, view=read_before)       # a store of its own
    assert refused.value.exit_code == 2
    # the run is as the other driver left it: no second drive, no new segment, no new token
    assert (side / "second.count").read_text().split() == ["ran", "ran"]
    live = sorted(p.name for p in (Path(store + ".d") / "journals").glob("*.jsonl"))
    assert live == [], live
    view = json.loads(_cli(env, store, "status", run_id, "--json").stdout)
    assert view["state"] == "succeeded" and not view["driver_alive"]
    con = duckdb.connect(store, read_only=True)
    try:
        token, state = con.execute("SELECT token, state FROM runs WHERE run_id = ?",
                                   [run_id]).fetchone()
    finally:
        con.close()
    assert (token, state) == (2, "succeeded")


def test_a_resume_from_a_read_older_than_another_drivers_failed_drive_starts_from_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other driver failed again: the run is resumed from where that drive left it
    (its attempt numbers go on), not from the older read (which reused attempt 2)."""
    run_id, store, env, side = _failed_run(tmp_path)
    (side / "fixed").unlink()
    monkeypatch.setenv("SIDE", str(side))
    read_before = api.open_ledger(store).get_run(run_id)
    other = _cli(env, store, "resume", run_id)                  # fails again: attempt 2
    assert other.returncode == 1, other.stderr
    (side / "fixed").write_text("")
    run = api.resume(run_id, store=store, view=read_before, executor="inline")
    assert run.state == "succeeded"
    assert (side / "second.count").read_text().split() == ["ran"] * 3
    view = json.loads(_cli(env, store, "status", run_id, "--json").stdout)
    assert {t["key"]: t["attempts"] for t in view["tasks"]} == {"first": 1, "second": 3}
    con = duckdb.connect(store, read_only=True)
    try:
        numbers = [n for (n,) in con.execute(
            "SELECT attempt FROM attempts WHERE run_id = ? AND task_key = 'second' "
            "ORDER BY attempt", [run_id]).fetchall()]
    finally:
        con.close()
    assert numbers == [1, 2, 3], numbers


def test_a_driver_that_cannot_fold_at_its_end_says_the_tables_are_behind(
        tmp_path: Path) -> None:
    """Another process holds the ledger file through the driver's fold at release (here a
    plain DuckDB reader; a slow pipeline import in a resume's read does it too): the run
    still ends 0, and says that the SQL tables lag its journal until ``pipeline fold``
    (it was silent: SQL disagreed with ``pipeline status`` after a normal exit)."""
    run_id, store, env, side = _failed_run(tmp_path)
    (tmp_path / "holder.py").write_text(HOLDER)
    env.update(LEDGERFLOW_LOCK_TIMEOUT="1", LEDGER=store, HOLDER=str(tmp_path / "holder.py"))
    try:
        done = _cli(env, store, "resume", run_id)
    finally:
        (side / "go").write_text("")
    wait_until((side / "released").exists, timeout=60, what="the holder to let go",
               every=0.05)
    assert done.returncode == 0, done.stderr
    assert "pipeline fold" in done.stderr and "behind" in done.stderr, done.stderr
    con = duckdb.connect(store, read_only=True)
    try:
        assert con.execute("SELECT state FROM runs WHERE run_id = ?",
                           [run_id]).fetchone() == ("failed",)          # what it says
    finally:
        con.close()
    assert _cli(env, store, "fold").returncode == 0
    view = json.loads(_cli(env, store, "status", run_id, "--json").stdout)
    con = duckdb.connect(store, read_only=True)
    try:
        state = con.execute("SELECT state FROM runs WHERE run_id = ?", [run_id]).fetchone()
        tasks = dict(con.execute("SELECT task_key, attempts FROM tasks WHERE run_id = ?",
                                 [run_id]).fetchall())
    finally:
        con.close()
    assert state == (view["state"],) == ("succeeded",)
    assert tasks == {t["key"]: t["attempts"] for t in view["tasks"]} == {"first": 1,
                                                                          "second": 2}


def test_a_resume_from_a_read_made_while_another_driver_drove_to_the_end_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 2 with a message, not 70, and nothing left on the succeeded run."""
    run_id, store, env, side = _failed_run(tmp_path)
    monkeypatch.setenv("SIDE", str(side))
    other = subprocess.Popen([sys.executable, "-m", "ledgerflow", "resume", run_id, "--store",
                              store], env={**env, "WAIT": "1"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        def driving_second() -> bool:       # the other resume is alive and runs `second`
            assert other.poll() is None, "the other resume ended before it drove `second`"
            return len((side / "second.count").read_text().split()) >= 2

        wait_until(driving_second, timeout=120, what="the other resume driving `second`",
                   every=0.05)
        read_while = api.open_ledger(store).get_run(run_id)
        assert read_while.state == "running" and read_while.driver_alive is True
    finally:
        (side / "go").write_text("")
    assert other.wait(timeout=120) == 0
    with pytest.raises(NotResumableError, match="already succeeded") as refused:
        api.resume(run_id, store=store, view=read_while)
    assert refused.value.exit_code == 2
    assert (side / "second.count").read_text().split() == ["ran", "ran"]
    live = sorted(p.name for p in (Path(store + ".d") / "journals").glob("*.jsonl"))
    assert live == [], live
    con = duckdb.connect(store, read_only=True)
    try:
        assert con.execute("SELECT token, state FROM runs WHERE run_id = ?",
                           [run_id]).fetchone() == (2, "succeeded")
    finally:
        con.close()
