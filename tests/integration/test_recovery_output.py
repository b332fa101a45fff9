"""What the CLI says after a crash or a double Ctrl-C: it matches what happened.

Real ``pipeline`` processes, SIGKILLed (or interrupted twice) while tasks run,
then resumed: the attempts that died with the driver are shown as lost (not
failed), the tasks that then succeeded show no error, a lost attempt's reason
has no stray separator, and a double Ctrl-C says how to resume.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

FLOW = '''
import os, time
from pathlib import Path
from ledgerflow import pipeline, task

@task
def items(n: int) -> list[int]:
    return list(range(n))

@task
def slow(i: int) -> int:
    Path(os.environ["MARKS"], f"started-{i}").touch()
    time.sleep(float(os.environ.get("DELAY", "0")))
    return i

@pipeline
def fan(n: int = 3):
    return slow.map(items(n))
'''


def _project(tmp: Path, **extra: str) -> tuple[str, str, dict[str, str]]:
    flow = tmp / "flow.py"
    flow.write_text(FLOW)
    marks = tmp / "marks"
    marks.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(PYTHONUNBUFFERED="1", MARKS=str(marks), **extra)
    return str(flow), str(tmp / "ledger.duckdb"), env


def _start_running(flow: str, ledger: str, env: dict[str, str], marks: Path
                   ) -> tuple[subprocess.Popen[str], str]:
    """A run whose three ``slow`` tasks are all running."""
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", flow, "--store", ledger,
                             "--workers", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("run "), first
    wait_until(lambda: len(list(marks.glob("started-*"))) == 3, timeout=120,
               what="three running tasks")
    return proc, first.split()[1]


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=180)


def test_after_a_kill_the_resume_shows_lost_attempts_and_clean_successes(
        tmp_path: Path) -> None:
    flow, ledger, env = _project(tmp_path, DELAY="60")
    proc, run_id = _start_running(flow, ledger, env, tmp_path / "marks")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    res = _cli(["resume", run_id, "--store", ledger], {**env, "DELAY": "0"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"run {run_id}  resuming"
    for i in range(3):
        assert any(line.split()[:2] == ["lost", f"slow[{i}]"] for line in lines), res.stdout
    assert not any(line.split()[:1] == ["failed"] for line in lines), res.stdout
    table = [line for line in lines if "slow[" in line and "│" in line]
    assert len(table) == 3 and all("succeeded" in row for row in table)
    assert not any("lost" in row or "driver died" in row for row in table), res.stdout
    shown = _cli(["status", run_id, "--store", ledger, "--task", "slow[0]"], env)
    assert shown.returncode == 0, shown.stderr
    attempt = next(line for line in shown.stdout.splitlines() if "attempt 1:" in line)
    assert attempt.split()[2] == "lost" and attempt.split()[3].startswith("<=")
    assert "  the driving process died" in attempt and ": the driving" not in attempt
    assert "error:" not in shown.stdout           # the task succeeded in the end
    doc = json.loads(_cli(["status", run_id, "--store", ledger, "--task", "slow[0]",
                           "--json"], env).stdout)
    assert [a["outcome"] for a in doc["attempts"]] == ["lost", "ok"]


def test_a_double_ctrl_c_exits_at_once_and_says_how_to_resume(tmp_path: Path) -> None:
    flow, ledger, env = _project(tmp_path, DELAY="60")
    proc, run_id = _start_running(flow, ledger, env, tmp_path / "marks")
    proc.send_signal(signal.SIGINT)
    assert proc.stderr is not None
    wait_until(lambda: "cancelling" in proc.stderr.readline(), timeout=60,
               what="the first Ctrl-C's line")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"pipeline resume {run_id}" in err, err
    res = _cli(["resume", run_id, "--store", ledger], {**env, "DELAY": "0"})
    assert res.returncode == 0, res.stderr
