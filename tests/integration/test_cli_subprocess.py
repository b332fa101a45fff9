"""The CLI in real subprocesses: kill -9 and resume, status and cancel from outside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

PIPELINE = [sys.executable, "-m", "ledgerflow"]

CHAIN = """
import os, time
from pathlib import Path
from ledgerflow import task, pipeline

SIDE = Path(os.environ["SIDE_EFFECTS"])

@task
def link(i: int, prev: int) -> int:
    time.sleep(float(os.environ.get("STEP_DELAY", "0.15")))
    with open(SIDE / f"{i}.count", "a") as fh:
        fh.write("x")
    return prev + 1

@task
def fan(i: int) -> int:
    time.sleep(float(os.environ.get("STEP_DELAY", "0.15")))
    with open(SIDE / f"fan-{i}.count", "a") as fh:
        fh.write("x")
    return i

@pipeline
def chain(n: int = 15):
    x = 0
    for i in range(n):
        x = link(i, x)
    return x

@pipeline
def fanout(n: int = 40):
    return fan.map(list(range(n)))
"""


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    side = tmp / "side"
    side.mkdir(exist_ok=True)
    env.update(SIDE_EFFECTS=str(side), PYTHONUNBUFFERED="1", **extra)
    return env


def _project(tmp: Path, **extra: str) -> tuple[Path, str, dict[str, str]]:
    """A pipeline file, a ledger path and an environment in ``tmp``."""
    flow = tmp / "flow.py"
    flow.write_text(CHAIN)
    return flow, str(tmp / "ledger.duckdb"), _env(tmp, **extra)


def _start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([*PIPELINE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("run "), first + (proc.stderr.read() if proc.stderr else "")
    return proc, first.split()[1]


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate()


def _status(run_id: str, ledger: str, env: dict[str, str]) -> dict:
    out = subprocess.run([*PIPELINE, "status", run_id, "--store", ledger, "--json"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _counts(side: Path) -> dict[str, int]:
    return {p.stem: len(p.read_text()) for p in side.glob("*.count")}


@pytest.mark.parametrize("target, workers, n", [("chain", 1, 15), ("fanout", 4, 40)])
def test_kill_9_then_resume_reruns_nothing_that_finished(tmp_path: Path, target: str,
                                                         workers: int, n: int) -> None:
    flow, ledger, env = _project(tmp_path)
    proc, run_id = _start(["run", f"{flow}:{target}", "-p", f"n={n}", "--store", ledger,
                           "--workers", str(workers)], env)
    side = tmp_path / "side"
    wait_until(lambda: len(_counts(side)) >= n // 3, what="a third of the tasks")
    _kill(proc)
    before = _counts(side)
    assert 0 < len(before) < n
    view = _status(run_id, ledger, env)
    assert view["state"] == "running" and view["driver_alive"] is False
    done_before = {t["key"] for t in view["tasks"] if t["state"] == "succeeded"}
    res = subprocess.run([*PIPELINE, "resume", run_id, "--store", ledger, "--workers",
                          str(workers)], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    after = _counts(side)
    assert len(after) == n
    view = _status(run_id, ledger, env)
    assert view["state"] == "succeeded"
    assert all(t["state"] == "succeeded" for t in view["tasks"])
    # no task whose success was committed before the kill ran again
    prefix = "" if target == "chain" else "fan-"
    for t in view["tasks"]:
        if t["key"] in done_before:
            i = t["key"].split("[")[-1].rstrip("]") if "[" in t["key"] else None
            name = f"{prefix}{i}" if i is not None else None
            if name is not None:
                assert after[name] == 1, (t["key"], after[name])
    assert sum(after.values()) <= n + workers     # at most the in-flight ones ran twice
    if target == "chain":
        assert max(after.values()) <= 2
        ones = [k for k, v in after.items() if v == 1]
        assert len(ones) >= len(done_before)


def test_status_and_cancel_from_a_second_process(tmp_path: Path) -> None:
    flow, ledger, env = _project(tmp_path, STEP_DELAY="0.3")
    proc, run_id = _start(["run", f"{flow}:chain", "-p", "n=40", "--store", ledger], env)
    # status from a second process shows a running task
    wait_until(lambda: [t for t in _status(run_id, ledger, env)["tasks"]
                        if t["state"] == "running"], what="a running task", every=0)
    res = subprocess.run([*PIPELINE, "cancel", run_id, "--store", ledger], capture_output=True,
                         text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    proc.communicate(timeout=60)
    assert proc.returncode == 1
    view = _status(run_id, ledger, env)
    assert view["state"] == "cancelled"
    states = {t["state"] for t in view["tasks"]}
    assert "running" not in states and "cancelled" in states
    res = subprocess.run([*PIPELINE, "runs", "--store", ledger, "--json"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert json.loads(res.stdout)[0]["state"] == "cancelled"


def test_resume_of_a_live_run_is_refused(tmp_path: Path) -> None:
    flow, ledger, env = _project(tmp_path, STEP_DELAY="0.3")
    proc, run_id = _start(["run", f"{flow}:chain", "-p", "n=20", "--store", ledger], env)
    try:
        time.sleep(1.0)
        res = subprocess.run([*PIPELINE, "resume", run_id, "--store", ledger],
                             capture_output=True, text=True, env=env, timeout=60)
        assert res.returncode == 2
        assert "still being driven by pid" in res.stderr
    finally:
        _kill(proc)


def test_rerun_reuses_everything_and_one_changed_item_reruns_alone(tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(CHAIN.replace('time.sleep(float(os.environ.get("STEP_DELAY", "0.15")))',
                                  "pass") + """
@task
def double(x: int) -> int:
    with open(SIDE / f"double-{x}.count", "a") as fh:
        fh.write("x")
    return 2 * x

@pipeline
def items(xs: list):
    return double.map(fan.map(xs))
""")
    ledger = str(tmp_path / "ledger.duckdb")
    env = _env(tmp_path)
    side = tmp_path / "side"
    for xs in ("[1,2,3]", "[1,2,3]", "[1,2,4]"):
        res = subprocess.run([*PIPELINE, "run", f"{flow}:items", "-p", f"xs={xs}",
                              "--store", ledger, "--json"], capture_output=True, text=True,
                             env=env, timeout=60)
        assert res.returncode == 0, res.stderr
    counts = _counts(side)
    assert counts == {"fan-1": 1, "fan-2": 1, "fan-3": 1, "fan-4": 1,
                      "double-1": 1, "double-2": 1, "double-3": 1, "double-4": 1}
    doc = json.loads(res.stdout)
    cached = {t["key"] for t in doc["tasks"] if t["cached"]}
    assert cached == {"fan[1]", "fan[2]", "double[1]", "double[2]"}


def test_ctrl_c_cancels_and_leaves_a_resumable_run(tmp_path: Path) -> None:
    flow, ledger, env = _project(tmp_path, STEP_DELAY="0.2")
    proc, run_id = _start(["run", f"{flow}:chain", "-p", "n=30", "--store", ledger], env)
    side = tmp_path / "side"
    wait_until(lambda: len(_counts(side)) >= 3, what="three finished tasks")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "cancelling" in err and "Traceback" not in err
    assert _status(run_id, ledger, env)["state"] == "cancelled"
    res = subprocess.run([*PIPELINE, "resume", run_id, "--store", ledger], capture_output=True,
                         text=True, env={**env, "STEP_DELAY": "0"}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert _status(run_id, ledger, env)["state"] == "succeeded"
    assert max(_counts(side).values()) <= 2


def test_two_runs_on_one_ledger_both_proceed(tmp_path: Path) -> None:
    flow, ledger, env = _project(tmp_path, STEP_DELAY="0.05")
    procs = [subprocess.Popen([*PIPELINE, "run", f"{flow}:fanout", "-p", f"n={n}", "--store",
                               ledger, "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for n in (30, 31)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    ids = {json.loads(o[0])["run_id"] for o in outs}
    listed = subprocess.run([*PIPELINE, "runs", "--store", ledger, "--json"],
                            capture_output=True, text=True, env=env, timeout=60)
    runs = {r["run_id"]: r for r in json.loads(listed.stdout)}
    assert set(runs) == ids and all(r["state"] == "succeeded" for r in runs.values())
