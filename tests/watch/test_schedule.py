"""Schedules: ``--every`` starts runs at its slots, ``--cron`` too, and slots missed while a
run is going are skipped, not run one each (the stated policy); bad input is exit code 2."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from .helpers import TICKING as FLOW
from .helpers import Watcher, env_for, watch_command

pytest.importorskip("croniter")

def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def runs(w: Watcher, n: int) -> list[tuple[dict, dict]]:
    out = []
    for _ in range(n):
        begun = w.next_event()
        assert begun["event"] == "start"
        end = w.next_end()
        assert end["run_id"] == begun["run_id"] and end["state"] == "succeeded", end
        out.append((begun, end))
    return out


def test_every_runs_at_its_slots_a_bounded_number_of_times(tmp_path: Path) -> None:
    (tmp_path / "flow.py").write_text(FLOW)
    w = Watcher(tmp_path, "flow.py", "--every", "1s", "--max-runs", "3")
    done = runs(w, 3)
    assert w.proc.wait(60) == 0
    w.stop()
    kinds = [b["trigger"]["kind"] for b, _ in done]
    assert kinds == ["start", "every", "every"]
    slots = [epoch(b["trigger"]["slot"]) for b, _ in done[1:]]
    # on the 1 s grid: the next slot, or later by the slots a slow run made it skip
    skipped = done[2][0]["trigger"]["missed"]
    assert slots[1] - slots[0] == pytest.approx(1.0 + skipped, abs=0.01)
    for (begun, _), slot in zip(done[1:], slots, strict=True):
        assert begun["at"] >= slot - 0.01                          # not before its slot
    from ledgerflow.opening import open_ledger
    st = open_ledger(str(tmp_path / "ledger.duckdb"))
    recorded = {r.run_id: r for r in st.list_runs()}
    assert set(recorded) == {b["run_id"] for b, _ in done}         # ordinary runs
    trig = json.loads(st.get_run(done[1][0]["run_id"]).options)["trigger"]
    assert trig["kind"] == "every" and trig["slot"] == done[1][0]["trigger"]["slot"]
    from ledgerflow.explain import explain_run
    said = explain_run(st, done[1][0]["run_id"])
    assert said.trigger == trig and said.against == done[0][0]["run_id"]
    assert [t.reason for t in said.tasks] == ["not_reused"]       # tick has cache=False


def test_slots_missed_during_a_long_run_are_skipped_not_queued(tmp_path: Path) -> None:
    (tmp_path / "flow.py").write_text(FLOW)
    w = Watcher(tmp_path, "flow.py", "-p", "seconds=2.2", "--every", "1s", "--max-runs", "3")
    done = runs(w, 3)
    assert w.proc.wait(60) == 0
    w.stop()
    (_, end1), (b2, end2), (b3, _) = done
    # the next run is at the first slot after the previous one ended, never a burst
    assert epoch(b2["trigger"]["slot"]) >= end1["at"] - 0.01
    assert epoch(b3["trigger"]["slot"]) >= end2["at"] - 0.01
    assert b3["trigger"]["missed"] >= 1          # the slots that passed during run 2
    assert epoch(b3["trigger"]["slot"]) - epoch(b2["trigger"]["slot"]) >= 2.0


def test_cron_runs_at_cron_slots(tmp_path: Path) -> None:
    (tmp_path / "flow.py").write_text(FLOW)
    w = Watcher(tmp_path, "flow.py", "--cron", "* * * * * *", "--max-runs", "2")
    (b1, _), (b2, _) = runs(w, 2)
    assert w.proc.wait(60) == 0
    w.stop()
    assert b1["trigger"]["kind"] == "start" and b2["trigger"]["kind"] == "cron"
    assert epoch(b2["trigger"]["slot"]) % 1 == 0          # a whole second, as cron says


@pytest.mark.parametrize("args, message", [
    (["--every", "soon"], "--every: not a duration: 'soon'"),
    (["--cron", "not cron"], "--cron: not a cron expression"),
    ([], "nothing to watch"),
    (["--path", "missing-folder"], "watched path not found: missing-folder"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                          message: str) -> None:
    (tmp_path / "flow.py").write_text(FLOW)
    done = subprocess.run([*watch_command(), "flow.py", *args], cwd=tmp_path,
                          env=env_for(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "ledger.duckdb").exists()          # nothing ran
