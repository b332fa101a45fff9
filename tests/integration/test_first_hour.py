"""The first hour's rough edges (issue 30), in real ``pipeline`` processes.

A mapped task's lineage names the list it was mapped over (``pipeline lineage``,
``Run.lineage()``, ``pipeline explain``, the console's graph), and a run recorded
without that edge still resumes; ``pipeline doctor`` is green after ``pipeline
repair`` alone on a damaged journal, the damage told as history; a task whose attempt
was lost with no retries left and that then succeeds on resume shows no error.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.integration.test_damaged_ledger import FLOW as DAMAGED_FLOW
from tests.integration.test_damaged_ledger import _flipped, _garbage, _killed_mid_run
from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]

FLOW = '''
import os, time
from ledgerflow import pipeline, task

@task
def fetch(n: int, scale: int = 1) -> list[dict]:
    return [{"id": i, "v": i * scale} for i in range(n)]

@task
def load_model() -> str:
    return "model-1"

@task
def square(item: dict, model: str) -> int:
    if os.environ.get("FAIL_AT") == str(item["id"]):
        raise RuntimeError("asked to fail")
    return item["v"] ** 2

@task
def total(xs: list[int]) -> int:
    return sum(xs)

@pipeline
def squares(n: int = 3, scale: int = 1):
    return total(square.map(fetch(n, scale), key="id", model=load_model()))

@task
def effect(i: int) -> int:
    mark = os.environ["MARK"] + str(i)
    if i == 1 and not os.path.exists(mark):     # the first attempt of effect[1] hangs
        open(mark, "w").close()
        time.sleep(120)
    return i

@pipeline
def effects(n: int = 3):
    return total(effect.map(fetch_ints(n)))

@task
def fetch_ints(n: int) -> list[int]:
    return list(range(n))
'''


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    return {**env, "MARK": str(tmp / "hung-"), "PYTHONUNBUFFERED": "1", **extra}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=180)


def _run(env: dict[str, str], flow: Path, ledger: str, *args: str) -> dict:
    res = _cli(env, "run", f"{flow}:squares", *args, "--store", ledger, "--json")
    assert res.stdout, res.stderr
    return json.loads(res.stdout)


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    return flow, str(tmp_path / "ledger.duckdb"), _env(tmp_path)


def test_a_mapped_task_s_lineage_names_the_list_it_was_mapped_over(project) -> None:
    flow, ledger, env = project
    first = _run(env, flow, ledger, "-p", "n=3")
    assert first["state"] == "succeeded"
    rid = first["run_id"]
    res = _cli(env, "lineage", rid, "--task", "square[1]", "--store", ledger, "--json")
    assert res.returncode == 0, res.stderr
    inputs = [r["uri"] for r in json.loads(res.stdout)
              if r["task_key"] == "square[1]" and r["direction"] == "input"]
    assert inputs == ["task:fetch", "task:load_model"]      # the list first, then model=
    # the ancestry of what reads the fan-out reaches the list's producer
    res = _cli(env, "lineage", rid, "--task", "total", "--store", ledger, "--json")
    assert "fetch" in {r["task_key"] for r in json.loads(res.stdout)}

    import ledgerflow
    rows = ledgerflow.get_run(rid, store=ledger).lineage("square[0]")
    assert {r["uri"] for r in rows if r["direction"] == "input"} == {"task:fetch",
                                                                    "task:load_model"}
    graphs = pytest.importorskip("ledgerflow_console.graphs")
    from ledgerflow.opening import open_ledger
    edges = graphs.graph(open_ledger(ledger).get_run(rid))["edges"]
    assert {"from": "fetch", "to": "square[2]"} in edges

    # the list changed: a child whose item changed ran for its item (an argument), not for
    # an input every child reads (square[0] kept its item and was reused)
    second = _run(env, flow, ledger, "-p", "n=3", "-p", "scale=2")
    res = _cli(env, "explain", second["run_id"], "--store", ledger, "--json")
    assert res.returncode == 0, res.stderr
    by = {t["key"]: t for t in json.loads(res.stdout)["tasks"]}
    assert by["square[0]"]["reason"] == "cached"            # its item {id 0, v 0} is the same
    assert by["square[1]"]["reason"] == "argument"
    assert by["square[1]"]["detail"] == "ran: a parameter changed: scale 1 -> 2"
    assert by["total"]["reason"] == "input"                  # it reads the children


def test_a_run_recorded_without_the_edge_still_resumes(project) -> None:
    flow, ledger, env = project
    failed = _run({**env, "FAIL_AT": "2"}, flow, ledger, "-p", "n=3")
    assert failed["state"] == "failed"
    rid = failed["run_id"]
    # what a ledgerflow before the edge recorded: the children name only model=
    con = duckdb.connect(ledger)
    con.execute("UPDATE tasks SET upstream = ['load_model'] WHERE run_id = ? AND node = "
                "'square'", [rid])
    con.close()
    res = _cli(env, "resume", rid, "--store", ledger)
    assert res.returncode == 0, res.stderr
    doc = json.loads(_cli(env, "status", rid, "--store", ledger, "--json").stdout)
    assert doc["state"] == "succeeded"
    attempts = {t["key"]: t["attempts"] for t in doc["tasks"]}
    assert attempts["square[0]"] == attempts["square[1]"] == 1      # reused, not re-run
    assert attempts["square[2]"] == 2 and attempts["total"] == 1
    rows = json.loads(_cli(env, "lineage", rid, "--task", "square[2]", "--store", ledger,
                           "--json").stdout)
    assert "task:load_model" in {r["uri"] for r in rows if r["direction"] == "input"}


@pytest.mark.parametrize("damage", [_garbage, _flipped], ids=["garbage-line", "flipped-byte"])
def test_doctor_is_green_after_repair_alone_and_tells_the_damage_as_history(
        tmp_path: Path, damage) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(DAMAGED_FLOW)
    ledger = str(tmp_path / "ledger.duckdb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env["SIDE"] = str(tmp_path / "side.log")
    run_id, journal = _killed_mid_run(flow, ledger, env)
    damage(journal)
    doctor = _cli(env, "doctor", "--store", ledger)
    assert doctor.returncode == 2 and f"fix: pipeline resume {run_id} re-runs it" in doctor.stdout
    repair = _cli(env, "repair", "--store", ledger)
    assert repair.returncode == 0, repair.stderr
    assert f"run {run_id}: journal token 1 cut at byte" in repair.stdout
    doctor = _cli(env, "doctor", "--store", ledger)
    assert doctor.returncode == 0, doctor.stdout
    assert "PROBLEM" not in doctor.stdout and "no problems found" in doctor.stdout
    told = [ln for ln in doctor.stdout.splitlines() if journal.name in ln]
    assert len(told) == 1 and "is damaged at byte" in told[0]
    assert "(history: pipeline repair kept what came before it" in told[0]
    # the byte doctor names is the one the repair cut at
    byte = told[0].split("is damaged at byte ")[1].split(":")[0]
    assert f"journal token 1 cut at byte {byte} (" in repair.stdout
    assert f"fix: pipeline resume {run_id}" in doctor.stdout and "RUN_ID" not in doctor.stdout
    status = _cli(env, "status", run_id, "--store", ledger)
    assert "notice: journal_damage_repaired: pipeline repair: journal token 1 cut" \
        in status.stdout and "None attempt None" not in status.stdout
    res = _cli(env, "resume", run_id, "--store", ledger, "--executor", "inline")
    assert res.returncode == 0, res.stderr
    assert _cli(env, "doctor", "--store", ledger).returncode == 0


def test_a_lost_attempt_with_no_retries_left_leaves_no_error_once_it_succeeds(
        project, tmp_path: Path) -> None:
    flow, ledger, env = project
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", f"{flow}:effects",
                             "--store", ledger, "--executor", "inline"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    rid = proc.stdout.readline().split()[1]
    wait_until(lambda: (tmp_path / "hung-1").exists(), timeout=120,
               what="the first attempt of effect[1]")

    def committed_running() -> bool:
        # the start of an in-driver attempt may lag its commit by the stated bound: a
        # kill inside it leaves an attempt the ledger never saw (re-run, not lost)
        res = _cli(env, "status", rid, "--store", ledger, "--task", "effect[1]", "--json")
        return res.returncode in (0, 1) and json.loads(res.stdout)["state"] == "running"
    wait_until(committed_running, timeout=120, what="effect[1] committed as running")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    res = _cli(env, "resume", rid, "--store", ledger, "--executor", "inline")
    assert res.returncode == 0, res.stderr
    doc = json.loads(_cli(env, "status", rid, "--store", ledger, "--json").stdout)
    assert doc["state"] == "succeeded"
    assert {t["key"]: t["error"] for t in doc["tasks"]} == dict.fromkeys(
        ["fetch_ints", "effect[0]", "effect[1]", "effect[2]", "total"])
    one = json.loads(_cli(env, "status", rid, "--store", ledger, "--task", "effect[1]",
                          "--json").stdout)
    assert [a["outcome"] for a in one["attempts"]] == ["lost", "ok"]
    assert _cli(env, "fold", "--store", ledger).returncode == 0
    con = duckdb.connect(ledger, read_only=True)
    rows = con.execute("SELECT task_key, state, error FROM tasks WHERE run_id = ?",
                       [rid]).fetchall()
    con.close()
    assert sorted(rows) == sorted((k, "succeeded", None) for k in
                                  ["fetch_ints", "effect[0]", "effect[1]", "effect[2]", "total"])
    assert "attempt lost" not in _cli(env, "status", rid, "--store", ledger).stdout


SANDBOXED = '''
import sys
from ledgerflow import program
for view in ("declared", "host"):
    hello = program("hello-" + view, [sys.executable, "-c", "print('ran')"], sandbox="bwrap",
                    view=view)
    print(view, hello()["stdout"].strip())
'''


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_sandboxed_program_runs_the_python_of_a_venv_under_tmp(tmp_path: Path) -> None:
    """A checkout in ``mktemp -d`` has its .venv under /tmp, which the sandbox makes
    private: the driver's Python installation is bound over it, in both views."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    (tmp_path / "driver.py").write_text(SANDBOXED)
    site = [p for p in sys.path if p.endswith("site-packages")]
    env = {**_env(tmp_path), "PYTHONPATH": os.pathsep.join([str(ROOT / "sdk"), str(ROOT),
                                                            *site])}
    res = subprocess.run([str(venv / "bin" / "python"), str(tmp_path / "driver.py")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert "declared ran" in lines and "host ran" in lines, res.stdout
