"""Two ``pipeline resume RUN`` processes started at the same moment: exactly one drives.

The loser always refuses (exit 2, one line saying who drives or drove the run), whether
it comes while the winner drives or after the winner finished; it never drives the run
a second time from what it read before the winner took it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

FLOW = """
import os, time
from pathlib import Path
from ledgerflow import task, pipeline

SIDE = Path(os.environ["SIDE"])

def mark(name):
    with open(SIDE / f"{name}.count", "a") as fh:
        fh.write(f"{os.getpid()}\\n")

@task
def first() -> int:
    mark("first")
    return 1

@task
def second(x: int) -> int:
    mark("second")
    if not (SIDE / "fixed").exists():
        raise RuntimeError("not yet")
    while (SIDE / "hold").exists() and not (SIDE / "go").exists():
        time.sleep(0.05)
    return x + 1

@pipeline
def flow():
    return second(first())
"""

# both processes import ledgerflow, then wait for one file and start the command together
GATED = """
import os, sys, time
gate = sys.argv[1]
while not os.path.exists(gate):
    time.sleep(0.005)
sys.argv = ["pipeline", *sys.argv[2:]]
from ledgerflow.cli import main
main()
"""

REFUSED = ("is still being driven by pid", "is being resumed by pid", "already succeeded")


def _failed_run(tmp: Path) -> tuple[str, str, dict[str, str]]:
    """A run whose second task failed once; the fix is in (``fixed``)."""
    (tmp / "flow.py").write_text(FLOW)
    side = tmp / "side"
    side.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(SIDE=str(side), PYTHONUNBUFFERED="1")
    store = str(tmp / "ledger.duckdb")
    first = subprocess.run([sys.executable, "-m", "ledgerflow", "run", str(tmp / "flow.py"),
                            "--store", store], capture_output=True, text=True, env=env,
                           timeout=120)
    assert first.returncode == 1, first.stderr
    run_id = first.stdout.split()[1]
    (side / "fixed").write_text("")
    return run_id, store, env


def _two_resumes(tmp: Path, run_id: str, store: str, env: dict[str, str]
                 ) -> list[subprocess.Popen[str]]:
    gate = tmp / "gate"
    procs = [subprocess.Popen([sys.executable, "-c", GATED, str(gate), "resume", run_id,
                               "--store", store], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    time.sleep(1.0)       # both have started (a late one only comes later: still a loser)
    gate.write_text("")
    return procs


def _status(run_id: str, store: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "ledgerflow", "status", run_id, "--store",
                          store, "--json"], capture_output=True, text=True, env=env, timeout=120)
    return json.loads(out.stdout)


@pytest.mark.parametrize("round_", range(5))
def test_of_two_resumes_at_once_one_drives_and_the_other_refuses(tmp_path: Path,
                                                                   round_: int) -> None:
    run_id, store, env = _failed_run(tmp_path)
    one_drove(tmp_path, run_id, store, env)


def one_drove(tmp: Path, run_id: str, store: str, env: dict[str, str]) -> None:
    """Two resumes of ``run_id`` at once: one drove it to success, the other refused,
    and each task ran once more at most (the failed first try, then the winner's)."""
    procs = _two_resumes(tmp, run_id, store, env)
    outs = [p.communicate(timeout=180) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = outs[[p.returncode for p in procs].index(2)][1]
    assert any(r in loser for r in REFUSED), loser
    assert f"run {run_id}" in loser.splitlines()[0]
    side = tmp / "side"
    assert len((side / "second.count").read_text().split()) == 2
    assert len((side / "first.count").read_text().split()) == 1
    view = _status(run_id, store, env)
    assert view["state"] == "succeeded"
    assert {t["key"]: t["attempts"] for t in view["tasks"]} == {"first": 1, "second": 2}


def test_the_loser_names_the_pid_that_drives_the_run(tmp_path: Path) -> None:
    """While the winner drives (its task holds until the loser has given up), the loser
    says which process drives the run."""
    run_id, store, env = _failed_run(tmp_path)
    side = tmp_path / "side"
    (side / "hold").write_text("")
    procs = _two_resumes(tmp_path, run_id, store, env)
    wait_until(lambda: any(p.poll() is not None for p in procs), timeout=180,
               what="one of the two resumes to give up", every=0.05)
    (loser,) = [p for p in procs if p.poll() is not None]
    (winner,) = [p for p in procs if p is not loser]
    _, err = loser.communicate(timeout=60)
    (side / "go").write_text("")
    winner.communicate(timeout=180)
    assert (loser.returncode, winner.returncode) == (2, 0), err
    assert f"run {run_id} is still being driven by pid {winner.pid}" in err.splitlines()[0]
    assert len((side / "second.count").read_text().split()) == 2
