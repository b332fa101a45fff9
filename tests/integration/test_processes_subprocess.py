"""The ``processes`` executor in real subprocesses: workers die with a SIGKILLed driver,
and tasks defined in a script's ``__main__`` or a notebook-like cell run on it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ledgerflow.programs import descendants
from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

PIPELINE = [sys.executable, "-m", "ledgerflow"]

FLOW = '''
import os, sys, time
from pathlib import Path
from ledgerflow import pipeline, task
from ledgerflow import program

FX = Path(os.environ["FX"])

@task(retries=1)
def hold(i: int) -> int:
    a = __import__("ledgerflow").context().attempt
    (FX / f"start-{i}-{a}-{os.getpid()}").touch()
    if a == 1:
        time.sleep(3)                    # killed long before this ends
    (FX / f"done-{i}-{a}").touch()
    return i

# a program that starts a grandchild; both only sleep
sleeper = program("sleeper", [sys.executable, "-c",
    "import subprocess, sys, time, os; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "open(os.environ['FX'] + '/program-' + os.environ['LEDGERFLOW_ATTEMPT'], 'w').close(); "
    "time.sleep(0 if os.environ['LEDGERFLOW_ATTEMPT'] != '1' else 60)"], retries=1, grace=1)

@pipeline
def p():
    return [hold(1), hold(2), sleeper()]
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "?"


def test_a_sigkilled_driver_leaves_no_worker_and_resume_finishes(tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    fx = tmp_path / "fx"
    fx.mkdir()
    ledger = str(tmp_path / "ledger.duckdb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(FX=str(fx), PYTHONUNBUFFERED="1")
    log = tmp_path / "driver.log"
    with open(log, "w") as fh:      # a file, not a pipe: survivors cannot hold us up
        driver = subprocess.Popen([*PIPELINE, "run", f"{flow}:p", "--executor", "processes",
                                   "--workers", "3", "--store", ledger],
                                  stdout=fh, stderr=subprocess.STDOUT, env=env)
    below: list[int] = []
    try:
        first = wait_until(lambda: log.read_text().partition("\n")[0] if "\n" in
                           log.read_text() else "", what="the run id")
        assert first.startswith("run "), log.read_text()
        run_id = first.split()[1]
        wait_until(lambda: len(list(fx.glob("start-*-1-*"))) == 2
                   and (fx / "program-1").exists(),
                   what="both tasks and the program to be running")
        below = descendants(driver.pid)
        # the forkserver, three workers, the program's supervisor, the program, its child...
        assert len(below) >= 6, [(p, _cmd(p)) for p in below]
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        try:
            wait_until(lambda: not any(_alive(p) for p in below), timeout=5,
                       what="every process the driver had started to die")
        except AssertionError:
            raise AssertionError(
                f"left behind: {[(p, _cmd(p)) for p in below if _alive(p)]}") from None
    finally:
        for p in [driver.pid, *below]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    res = subprocess.run([*PIPELINE, "resume", run_id, "--executor", "processes", "--store",
                          ledger], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    out = subprocess.run([*PIPELINE, "status", run_id, "--store", ledger, "--json"],
                         capture_output=True, text=True, env=env, timeout=60)
    view = json.loads(out.stdout)
    assert view["state"] == "succeeded"
    # the killed attempts never finished their side effect; the resumed ones did
    done = sorted(f.name for f in fx.glob("done-*"))
    assert done == ["done-1-2", "done-2-2"]


SCRIPT = '''
import os, sys
from ledgerflow import pipeline, task

SCALE = 3

def helper(x):
    return x * SCALE

class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

@task
def work(x: int) -> list:
    p = Pair(helper(x), os.getpid())
    return [p.a, p.b]

@pipeline
def p(n: int = 3):
    return work.map(list(range(n)))

MAIN
'''

RUN = '''
run = p.run(store=sys.argv[1], executor="processes", workers=2)
out = run.result()
print(json.dumps({"values": [v for v, _ in out], "pids": [pid for _, pid in out],
                  "me": os.getpid()}))
'''


@pytest.mark.parametrize("how", ["script", "unguarded", "cell"])
def test_tasks_defined_in_main_run_on_processes(tmp_path: Path, how: str) -> None:
    """A script (``__main__`` with a file, with or without a main guard) and a
    notebook-like cell (code run with ``-c``, no source file): all ship their tasks
    and helpers by value, and workers do not run the script again."""
    ledger = str(tmp_path / "ledger.duckdb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    if how == "script":
        body = SCRIPT.replace("MAIN", "if __name__ == '__main__':\n    import json\n"
                              + textwrap.indent(RUN, "    "))
        path = tmp_path / "script.py"
        path.write_text(body)
        cmd = [sys.executable, str(path), ledger]
    elif how == "unguarded":
        path = tmp_path / "script.py"
        path.write_text(SCRIPT.replace("MAIN", "import json\n" + RUN))
        cmd = [sys.executable, str(path), ledger]
    else:
        cmd = [sys.executable, "-c", SCRIPT.replace("MAIN", "import json\n" + RUN), ledger]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["values"] == [0, 3, 6]
    assert doc["me"] not in doc["pids"]
    assert len(res.stdout.strip().splitlines()) == 1      # the run was started once
