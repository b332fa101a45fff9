"""``pipeline resume`` of a big run drives what is left from the graph the run recorded.

Real subprocesses on a real DuckDB ledger, with a 1,200-task chain (over the size
from which a run records its graph). The body appends a line to a file each time it
is traced, and each task a line each time it runs: a resume with the module
unchanged does not trace the body, after ``kill -9`` as after a failure; a resume
after the module was edited traces it again. Either way nothing kept runs again.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.cli import pipeline_cli
from tests.waiting import wait_until

FLOW = """
import os
import time
from pathlib import Path

from ledgerflow import pipeline, task

SIDE = Path(os.environ["RECIPE_SIDE"])


def _note(name: str, line: str) -> None:
    with open(SIDE / name, "a") as fh:
        fh.write(line + "\\n")


@task
def step(x: int, i: int) -> int:
    if i == int(os.environ.get("HANG_AT", "-1")):
        _note("hung", str(i))
        while not (SIDE / "go").exists():
            time.sleep(0.05)
    _note("ran", str(i))
    return x + i


@task
def last(x: int) -> int:
    if not (SIDE / "go").exists():
        raise ValueError("not yet")
    return x


@pipeline
def long(n: int = 1200):
    _note("traced", "t")
    x = step(0, 0)
    for i in range(1, n):
        x = step(x, i)
    return last(x)
"""

N = 1200


def _state(run_id: str, ledger: str, env: dict[str, str], key: str) -> str | None:
    """Task ``key``'s state as ``pipeline status`` (another process) reads it."""
    doc = json.loads(pipeline_cli("status", run_id, "--store", ledger, "--json",
                                  env=env).stdout)
    return next((t["state"] for t in doc["tasks"] if t["key"] == key), None)


def _lines(side: Path, name: str) -> list[str]:
    path = side / name
    return path.read_text().split() if path.exists() else []


def _setup(tmp_path: Path, write_flow, cli_env: dict[str, str]
           ) -> tuple[str, str, Path, dict[str, str]]:
    side = tmp_path / "side"
    side.mkdir()
    env = {**cli_env, "RECIPE_SIDE": str(side)}
    return write_flow(FLOW), str(tmp_path / "ledger.duckdb"), side, env


def _result(run_id: str, ledger: str, env: dict[str, str]) -> object:
    res = pipeline_cli("result", run_id, "--store", ledger, "--json", env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_resume_after_a_failure_traces_only_when_the_module_changed(
        tmp_path: Path, write_flow, cli_env: dict[str, str]) -> None:
    flow, ledger, side, env = _setup(tmp_path, write_flow, cli_env)
    res = pipeline_cli("run", flow, "--store", ledger, "--json", env=env)
    assert res.returncode == 1, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    assert len(_lines(side, "traced")) == 1 and len(_lines(side, "ran")) == N
    # unchanged module, the task still failing: nothing traced, nothing kept ran again
    res = pipeline_cli("resume", run_id, "--store", ledger, "--executor", "inline", env=env)
    assert res.returncode == 1, res.stderr
    assert len(_lines(side, "traced")) == 1
    # the module edited (a comment is enough): the resume traces the body again
    Path(flow).write_text(Path(flow).read_text() + "\n# edited\n")
    (side / "go").write_text("")
    res = pipeline_cli("resume", run_id, "--store", ledger, "--executor", "inline", env=env)
    assert res.returncode == 0, res.stderr
    assert len(_lines(side, "traced")) == 2
    assert "the source of pipeline long changed since the run started" in res.stderr
    assert len(_lines(side, "ran")) == N              # every step ran once, in the first run
    assert _result(run_id, ledger, env) == sum(range(N))


def test_a_resume_after_kill_9_drives_the_rest_from_the_recorded_graph(
        tmp_path: Path, write_flow, cli_env: dict[str, str]) -> None:
    flow, ledger, side, env = _setup(tmp_path, write_flow, cli_env)
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", flow, "--store", ledger,
                             "--executor", "inline"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**env, "HANG_AT": "700"})
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("run "), first
    run_id = first.split()[1]
    wait_until(lambda: _lines(side, "hung"), timeout=240, what="step 700 to start")
    # the kill lands once the ledger shows step 700 running: every success before it is
    # committed (an inline start may run up to a commit lag ahead of its commit)
    wait_until(lambda: _state(run_id, ledger, env, "step-701") == "running", timeout=240,
               what="step 700's start in the ledger")
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert _lines(side, "ran") == [str(i) for i in range(700)]
    (side / "go").write_text("")
    res = pipeline_cli("resume", run_id, "--store", ledger, "--executor", "inline", env=env)
    assert res.returncode == 0, res.stderr
    assert len(_lines(side, "traced")) == 1           # the recorded graph, not a new trace
    # step 700 was in flight when killed: it runs again; the rest ran once each
    assert sorted(map(int, _lines(side, "ran"))) == list(range(N))
    assert _result(run_id, ledger, env) == sum(range(N))
    status = json.loads(pipeline_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert status["state"] == "succeeded"
