"""A change made while a run is going starts the next run (never lost, never a second run at
once); Ctrl-C during a run cancels it and stops the watcher cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import TICKING as FLOW
from .helpers import Watcher, wait_for

pytest.importorskip("watchfiles")

def test_a_change_during_a_run_starts_the_next_run(tmp_path: Path) -> None:
    (tmp_path / "flow.py").write_text(FLOW)
    watched = tmp_path / "watched"
    watched.mkdir()
    w = Watcher(tmp_path, "flow.py", "-p", "seconds=2", "--path", str(watched),
                "--debounce", "0.3s")
    try:
        assert w.next_end()["trigger"]["kind"] == "start"
        (watched / "one.txt").write_text("1")
        begun = w.next_event()
        assert begun["event"] == "start" and begun["trigger"]["paths"] == [
            str((watched / "one.txt").resolve())]
        (watched / "two.txt").write_text("2")          # while that run sleeps
        end = w.next_end()
        assert end["run_id"] == begun["run_id"] and end["pending"] is True
        follow = w.next_event()
        assert follow["event"] == "start"
        assert follow["trigger"]["paths"] == [str((watched / "two.txt").resolve())]
        assert follow["at"] >= end["at"]               # one run at a time
        assert w.next_end()["state"] == "succeeded"
    finally:
        assert w.stop() == 0


def test_ctrl_c_during_a_run_ends_the_run_and_stops(tmp_path: Path) -> None:
    """Like ``pipeline run``: the run is cancelled (a running task is waited for, as the
    threads executor cannot stop it); no run is left running and no other one starts."""
    (tmp_path / "flow.py").write_text(FLOW)
    w = Watcher(tmp_path, "flow.py", "-p", "seconds=3", "--every", "1h")
    begun = w.next_event()
    assert begun["event"] == "start"
    from ledgerflow.opening import open_ledger
    st = open_ledger(str(tmp_path / "ledger.duckdb"))

    def ticking() -> bool:
        try:
            return st.get_run(begun["run_id"]).tasks["tick"].state == "running"
        except Exception:    # not recorded yet
            return False

    wait_for(ticking, 60, "the task to start")
    assert w.stop(timeout=60) == 0
    assert [e["event"] for e in w.drain()] == ["start", "end"]
    view = st.get_run(begun["run_id"])
    assert view.state in ("cancelled", "succeeded") and not view.active
    assert json.loads(view.options)["trigger"]["kind"] == "start"
    assert [r.run_id for r in st.list_runs()] == [begun["run_id"]]


def test_ctrl_c_while_idle_stops_at_once(tmp_path: Path) -> None:
    (tmp_path / "flow.py").write_text(FLOW)
    w = Watcher(tmp_path, "flow.py", "--every", "1h")
    assert w.next_end()["state"] == "succeeded"
    assert w.stop(timeout=20) == 0


def test_a_second_watcher_of_the_same_target_is_refused(tmp_path: Path) -> None:
    import subprocess

    from .helpers import env_for, watch_command
    (tmp_path / "flow.py").write_text(FLOW)
    w = Watcher(tmp_path, "flow.py", "--every", "1h")
    try:
        assert w.next_end()["state"] == "succeeded"
        second = subprocess.run([*watch_command(), "flow.py", "--every", "1h"], cwd=tmp_path,
                                env=env_for(tmp_path), capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 2
        assert f"already watched with these parameters (watcher pid {w.proc.pid})" \
            in second.stderr
        other = subprocess.run([*watch_command(), "flow.py", "-p", "seconds=0.1",
                                "--every", "1h", "--max-runs", "1"], cwd=tmp_path,
                               env=env_for(tmp_path), capture_output=True, text=True,
                               timeout=60)
        assert other.returncode == 0, other.stderr      # other parameters: another target
    finally:
        assert w.stop() == 0
