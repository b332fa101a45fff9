"""Agent tasks driven by real ``pipeline`` subprocesses: SIGKILL mid-agent, approvals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

FLOW = '''
import os
from pathlib import Path
from ledgerflow import pipeline
from ledgerflow_agents import Arg, MockModel, agent_task, tool

@tool(writes=[Arg("out")])
def append_line(text: str, *, out: str) -> str:
    """Append a line to the side-effect file."""
    with open(os.path.join(out, "side.txt"), "a") as fh:
        fh.write(text + "\\n")
    return "appended " + text

MOCK = MockModel.from_file(os.environ["SCRIPT"])

@agent_task(model=MOCK, tools=[append_line], approve=os.environ.get("APPROVE", "").split() or (),
            retries=0)
def worker(job: str, out: str) -> str:
    """Do the job with the tools."""
    return job

@pipeline
def agents(out: str):
    return worker("append one, then two", out)
'''


def _project(tmp_path: Path, turns: list[dict], approve: str = "") -> tuple[Path, str,
                                                                           dict[str, str]]:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    (tmp_path / "out").mkdir()
    (tmp_path / "script.json").write_text(json.dumps({"turns": turns, "log": "requests.jsonl"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(SCRIPT=str(tmp_path / "script.json"), APPROVE=approve)
    return flow, str(tmp_path / "ledger.duckdb"), env


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def _requests(tmp_path: Path) -> list[dict]:
    path = tmp_path / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
        else []


def _side(tmp_path: Path) -> list[str]:
    path = tmp_path / "out" / "side.txt"
    return path.read_text().split() if path.exists() else []


def _calls(turn: str) -> dict:
    return {"tool_calls": [{"name": "append_line", "arguments": {"text": turn}}]}


def test_sigkill_mid_agent_then_resume_repeats_no_recorded_call(tmp_path: Path) -> None:
    turns = [_calls("one"), _calls("two"),
             {"text": "never seen", "delay": 60},       # the driver is killed waiting here
             {"text": "done"}]
    flow, ledger, env = _project(tmp_path, turns)
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", str(flow), "-p",
                             f"out={tmp_path / 'out'}", "--store", ledger],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        wait_until(lambda: len(_requests(tmp_path)) >= 3, timeout=60,
                   what="the third model request")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    assert _side(tmp_path) == ["one", "two"]
    res = _cli("runs", "--store", ledger, "--json", env=env)
    run_id = json.loads(res.stdout)[0]["run_id"]
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _side(tmp_path) == ["one", "two"]               # no tool ran twice
    digests = Counter(r["digest"] for r in _requests(tmp_path))
    first, second, killed, again = (r["digest"] for r in _requests(tmp_path))
    assert digests[first] == 1 and digests[second] == 1     # recorded: replayed, not re-asked
    assert killed == again                                   # the unfinished call is made again
    usage = json.loads(_cli("usage", run_id, "--store", ledger, "--json", env=env).stdout)
    assert usage["totals"]["model_calls"] == 3               # 2 before the kill + the last
    assert usage["totals"]["replayed"] == 2
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert status["state"] == "succeeded"


def test_a_tool_call_needing_approval_waits_then_runs_once(tmp_path: Path) -> None:
    turns = [_calls("one"), {"text": "done"}]
    flow, ledger, env = _project(tmp_path, turns, approve="append_line")
    res = _cli("run", str(flow), "-p", f"out={tmp_path / 'out'}", "--store", ledger, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    run_id = res.stdout.split()[1]
    assert _side(tmp_path) == []                             # nothing ran before the approval
    (req,) = json.loads(_cli("approvals", run_id, "--store", ledger, "--json", env=env).stdout)
    assert req["action"] == "tool:append_line" and '"text": "one"' in req["summary"]
    ok = _cli("approve", run_id, "worker", "--digest", req["digest"][:12], "--as", "ana",
              "--store", ledger, env=env)
    assert ok.returncode == 0, ok.stderr
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _side(tmp_path) == ["one"]                        # the tool ran once
    assert [r["turn"] for r in _requests(tmp_path)] == [0, 1]    # the first call replayed
    lineage = json.loads(_cli("lineage", run_id, "--store", ledger, "--task", "worker",
                              "--json", env=env).stdout)
    tools = [r for r in lineage if r["direction"] == "tool_call"]
    assert [(t["attrs"]["outcome"], t["attrs"]["approved_by"]) for t in tools] == [("ok", "ana")]
