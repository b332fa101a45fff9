"""Crashes at any instant: real ``pipeline`` processes SIGKILLed, then resumed.

Every run finishes after a resume, every committed success is kept (its task
never runs again), at most the attempts that were running re-execute (each
shown as ``lost``), and the SQL tables catch up with the journals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

FLOW = '''
import os, time
from ledgerflow import pipeline, task

SIDE = os.environ["SIDE"]

@task
def items(n: int) -> list[int]:
    return list(range(n))

@task(side_effects=True)      # its start is committed before it runs: no commit lag
def effect(i: int) -> int:
    with open(SIDE, "a") as fh:            # the side effect a re-run would repeat
        fh.write(f"effect[{i}]\\n")
    time.sleep(float(os.environ.get("DELAY", "0.02")))
    return i

@task
def total(xs: list[int]) -> int:
    return sum(xs)

@pipeline
def fan(n: int = 40):
    return total(effect.map(items(n)))

@task
def noop(i: int) -> int:
    return i

@pipeline
def wide(n: int = 20000):
    return noop.map(list(range(n)))
'''


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    return {**env, "SIDE": str(tmp / "side.log"), "PYTHONUNBUFFERED": "1", **extra}


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=180)


def _status(run_id: str, ledger: str, env: dict[str, str]) -> dict:
    res = _cli(["status", run_id, "--store", ledger, "--json"], env)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def _effects(tmp: Path) -> Counter[str]:
    side = tmp / "side.log"
    return Counter(side.read_text().split()) if side.exists() else Counter()


def _start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline()          # "run ID  pipeline ..." comes first
    assert first.startswith("run "), first + (proc.stderr.read() if proc.stderr else "")
    return proc, first.split()[1]


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)


def _succeeded(doc: dict) -> dict[str, int]:
    return {t["key"]: t["attempts"] for t in doc["tasks"] if t["state"] == "succeeded"}


@pytest.mark.parametrize("delay", [0.15, 0.35, 0.6, 0.9, 1.3, 1.8])
def test_a_kill_anywhere_in_the_first_run_of_a_new_ledger_is_resumed(
        tmp_path: Path, delay: float) -> None:
    """Killed while the brand-new ledger file and its schema are being created (the
    background fold runs every 0.1 s here, so the file is made early)."""
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    ledger = str(tmp_path / "new" / "ledger.duckdb")
    env = _env(tmp_path, LEDGERFLOW_FOLD_INTERVAL="0.1", LEDGERFLOW_FOLD_WAKE_BYTES="1",
               DELAY="0.04")
    proc, run_id = _start(["run", f"{flow}:fan", "-p", "n=100", "--store", ledger,
                           "--executor", "threads", "--workers", "2"], env)
    time.sleep(delay)
    _kill(proc)
    first = _status(run_id, ledger, env)
    before = _succeeded(first)
    ran_before = _effects(tmp_path)
    if first["state"] != "succeeded":       # (a slow machine may not get that far)
        res = _cli(["resume", run_id, "--store", ledger], env)
        assert res.returncode == 0, res.stderr
    after = _status(run_id, ledger, env)
    assert after["state"] == "succeeded"
    kept = _succeeded(after)
    for key, attempts in before.items():          # committed successes: kept as they were
        assert kept[key] == attempts, key
    again = _effects(tmp_path) - ran_before
    assert not {k for k in again if k in before}, "a committed success ran again"
    # the tables match the status after the next command that writes
    assert _cli(["fold", "--store", ledger], env).returncode == 0
    con = duckdb.connect(ledger, read_only=True)
    rows = dict(con.execute("SELECT task_key, state FROM tasks WHERE run_id = ?",
                            [run_id]).fetchall())
    con.close()
    assert rows == {t["key"]: t["state"] for t in after["tasks"]}


def test_a_kill_during_the_final_fold_is_caught_up_and_reused(tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    ledger = str(tmp_path / "ledger.duckdb")
    # no background fold: the whole journal is folded at the end, after the last commit
    env = _env(tmp_path, LEDGERFLOW_FOLD_INTERVAL="3600",
               LEDGERFLOW_FOLD_WAKE_BYTES=str(1 << 40))
    proc, run_id = _start(["run", f"{flow}:wide", "-p", "n=20000", "--store", ledger,
                           "--executor", "inline"], env)
    journal = Path(ledger + ".d") / "journals" / f"{run_id}.1.jsonl"

    def last_commit_written() -> bool:
        try:
            with open(journal, "rb") as fh:
                fh.seek(max(0, journal.stat().st_size - 400))
                return b'["S","succeeded"' in fh.read()
        except FileNotFoundError:
            return False
    wait_until(last_commit_written, timeout=120, every=0.005, what="the run's last commit")
    _kill(proc)                                     # inside the final fold
    assert journal.exists(), "the fold finished before the kill"   # not archived yet
    status = _status(run_id, ledger, env)
    assert status["state"] == "succeeded" and len(status["tasks"]) == 20000
    again = _cli(["run", f"{flow}:wide", "-p", "n=20000", "--store", ledger, "--json"], env)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert all(t["cached"] for t in second["tasks"]), "a re-run must reuse every task"
    con = duckdb.connect(ledger, read_only=True)
    state = con.execute("SELECT state FROM runs WHERE run_id = ?", [run_id]).fetchall()
    counts = con.execute("SELECT state, count(*) FROM tasks WHERE run_id = ? GROUP BY ALL",
                         [run_id]).fetchall()
    con.close()
    assert state == [("succeeded",)] and counts == [("succeeded", 20000)]


def test_an_inline_fan_out_killed_mid_run_re_executes_at_most_the_running_task(
        tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    ledger = str(tmp_path / "ledger.duckdb")
    env = _env(tmp_path, DELAY="0.05")
    proc, run_id = _start(["run", f"{flow}:fan", "--store", ledger, "--executor", "inline"],
                          env)
    wait_until(lambda: sum(_effects(tmp_path).values()) >= 12, what="a dozen side effects")
    _kill(proc)
    res = _cli(["resume", run_id, "--store", ledger, "--executor", "inline"], env)
    assert res.returncode == 0, res.stderr
    effects = _effects(tmp_path)
    assert set(effects) == {f"effect[{i}]" for i in range(40)}
    twice = [k for k, n in effects.items() if n > 1]
    assert len(twice) <= 1, twice
    attempts = json.loads(_cli(["status", run_id, "--store", ledger, "--task",
                                twice[0] if twice else "effect[0]", "--json"], env).stdout)
    if twice:
        assert [a["outcome"] for a in attempts["attempts"]] == ["lost", "ok"]
