"""Per-attempt logs: what a task prints and logs reaches ``pipeline logs`` for the
right task and attempt, on every executor, and never mixes into ``--json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FLOW = '''
import logging, sys
from ledgerflow import context, pipeline, task

log = logging.getLogger("flow")

@task(retries=1)
def talk(i: int) -> int:
    print(f"out {i} attempt {context().attempt}")
    print(f"err {i}", file=sys.stderr)
    log.warning("warned %d", i)
    if i == 1 and context().attempt == 1:
        raise ValueError("first try fails")
    return i

@pipeline
def p():
    print("the body prints too")
    return talk.map([0, 1, 2])
'''


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.parametrize("executor", ["inline", "threads", "processes"])
def test_output_reaches_pipeline_logs_per_task_and_attempt(
        executor: str, tmp_path: Path, write_flow, cli_env) -> None:
    flow = write_flow(FLOW)
    ledger = str(tmp_path / "l.duckdb")
    res = _cli("run", flow, "--store", ledger, "--executor", executor, "--json", env=cli_env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)            # the whole stdout is one JSON document
    assert doc["state"] == "succeeded"
    assert "the body prints too" in res.stderr and "out 0" not in res.stdout
    run_id = doc["run_id"]
    rows = json.loads(_cli("logs", run_id, "--store", ledger, "--json", env=cli_env).stdout)
    by = {(r["task_key"], r["attempt"]): r["text"] for r in rows}
    assert set(by) == {("talk[0]", 1), ("talk[1]", 1), ("talk[1]", 2), ("talk[2]", 1)}
    for (key, attempt), text in by.items():
        i = key[5]
        assert text.splitlines() == [f"out {i} attempt {attempt}", f"err {i}",
                                     f"WARNING flow: warned {i}"]
    one = _cli("logs", run_id, "--store", ledger, "--task", "talk[1]", "--attempt", "2",
               env=cli_env)
    assert one.returncode == 0
    assert one.stdout.splitlines() == ["=== talk[1] attempt 2", "out 1 attempt 2", "err 1",
                                       "WARNING flow: warned 1"]


def test_logs_are_echoed_with_the_task_key_when_asked(tmp_path: Path, write_flow,
                                                      cli_env) -> None:
    flow = write_flow(FLOW)
    res = _cli("run", flow, "--store", str(tmp_path / "l.duckdb"), "--executor", "threads",
               "--logs", "--json", env=cli_env)
    assert res.returncode == 0, res.stderr
    json.loads(res.stdout)
    assert "[talk[2]] out 2 attempt 1" in res.stderr.splitlines()
    assert "[talk[1]] WARNING flow: warned 1" in res.stderr.splitlines()


def test_output_over_the_cap_keeps_head_and_tail(tmp_path: Path, write_flow, cli_env) -> None:
    flow = write_flow('''
from ledgerflow import pipeline, task

@task
def chatty() -> int:
    for i in range(5000):
        print(f"line {i:05d}")
    return 1

@pipeline
def p():
    return chatty()
''')
    ledger = str(tmp_path / "l.duckdb")
    env = {**cli_env, "LEDGERFLOW_LOG_CAP": "2000"}
    res = _cli("run", flow, "--store", ledger, "--json", env=env)
    run_id = json.loads(res.stdout)["run_id"]
    (row,) = json.loads(_cli("logs", run_id, "--store", ledger, "--json", env=env).stdout)
    lines = row["text"].splitlines()
    assert lines[0] == "line 00000" and lines[-1] == "line 04999"
    assert row["dropped"] == 5000 * 11 - 2000
    assert f"[... {row['dropped']} characters dropped" in row["text"]
