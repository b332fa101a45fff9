"""Steps survive their attempt (durable as they complete); model and tool calls reach
the ledger, ``pipeline usage`` and lineage."""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerflow
from ledgerflow import context, pipeline, task


def _mark(marks: str, what: str, value: str) -> str:
    with open(marks, "a") as fh:
        fh.write(what + "\n")
    return value


@task(retries=1)
def agent(marks: str) -> str:
    ctx = context()
    first = ctx.step("call-1", _mark, marks, "call-1", "a")
    ctx.record_model_call(seq=1, provider="mock", model="m", key_alias="K", input_tokens=10,
                          output_tokens=5, cost=0.5, request_hash="rq", response_hash="rs")
    if ctx.attempt == 1:
        raise RuntimeError("the second step fails the first time")
    second = ctx.step("call-2", _mark, marks, "call-2", "b")
    ctx.record_tool_call(seq=1, tool="search", outcome="ok", arguments_digest="ad")
    return first + second


@pipeline
def talk(marks: str):
    return agent(marks)


@pytest.mark.parametrize("store", ["duckdb", "memory"])
def test_a_retry_gets_recorded_steps_back_and_calls_are_summed(tmp_path: Path,
                                                               store: str) -> None:
    marks = tmp_path / "marks"
    where = str(tmp_path / "l.duckdb") if store == "duckdb" else f"memory:{tmp_path}"
    run = talk.run(str(marks), store=where, executor="threads")
    assert run.result() == "ab"
    assert marks.read_text().split() == ["call-1", "call-2"]      # call-1 not redone
    usage = run.usage()
    assert usage["totals"]["model_calls"] == 2 and usage["totals"]["tokens"] == 30
    assert usage["totals"]["tool_calls"] == 1
    assert usage["by_model"][0]["model"] == "mock/m"
    # tool calls are counted where they belong: in all and by task, not by model or key
    assert usage["by_task"][0]["tool_calls"] == 1
    assert "tool_calls" not in usage["by_model"][0] and "tool_calls" not in usage["by_key"][0]
    rows = run.lineage("agent")
    assert {r["direction"] for r in rows} >= {"model_call", "tool_call"}


def test_a_step_is_durable_before_its_attempt_ends(tmp_path: Path) -> None:
    ledger = str(tmp_path / "l.duckdb")
    marks = tmp_path / "marks"

    import subprocess
    import sys
    flow = tmp_path / "flow.py"
    flow.write_text(
        "import os\nfrom pathlib import Path\nfrom ledgerflow import context, pipeline, task\n"
        f"TMP = Path({str(tmp_path)!r})\n"
        "@task\ndef dies(marks: str) -> str:\n"
        "    ctx = context()\n"
        "    def once():\n"
        "        with open(marks, 'a') as fh:\n"
        "            fh.write('before\\n')\n"
        "        return 'x'\n"
        "    ctx.step('before', once)\n"
        "    if not (TMP / 'second').exists():\n"
        "        (TMP / 'second').write_text('')\n"
        "        os._exit(3)\n"
        "    return 'done'\n"
        "@pipeline\ndef p(marks: str):\n    return dies(marks)\n")
    res = subprocess.run([sys.executable, "-m", "ledgerflow", "run", str(flow), "-p",
                          f"marks={marks}", "--store", ledger, "--executor", "inline"],
                         capture_output=True, text=True)
    assert res.returncode == 3          # the process itself exited, mid-attempt
    run_id = ledgerflow.runs(store=ledger)[0].run_id
    again = subprocess.run([sys.executable, "-m", "ledgerflow", "resume", run_id, "--store",
                            ledger, "--executor", "inline"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert marks.read_text().split() == ["before"]      # the step did not run again


@task
def noted() -> str:
    ctx = context()
    ctx.notice("budget_low", "half of the budget is spent")
    raise ledgerflow.NonRetryableError("stop here")


@pipeline
def noting():
    return noted()


@pytest.mark.parametrize("store", ["duckdb", "memory"])
def test_a_task_notice_reaches_the_ledger(tmp_path: Path, store: str) -> None:
    where = str(tmp_path / "l.duckdb") if store == "duckdb" else f"memory:{tmp_path}"
    run = noting.run(store=where, executor="threads")
    assert run.status().tasks["noted"].state == "failed"
    (n,) = [n for n in run.notices() if n["kind"] == "budget_low"]
    assert (n["task_key"], n["attempt"], n["message"]) == ("noted", 1,
                                                          "half of the budget is spent")


def test_calls_of_an_attempt_lost_with_its_process_are_journaled_on_resume(
        tmp_path: Path) -> None:
    import subprocess
    import sys
    ledger = str(tmp_path / "l.duckdb")
    flow = tmp_path / "flow.py"
    flow.write_text(
        "import os\nfrom pathlib import Path\nfrom ledgerflow import context, pipeline, task\n"
        f"TMP = Path({str(tmp_path)!r})\n"
        "@task\ndef dies() -> str:\n"
        "    ctx = context()\n"
        "    ctx.record_model_call(seq=ctx.attempt, provider='mock', model='m',\n"
        "                          input_tokens=7, output_tokens=3)\n"
        "    ctx.record_tool_call(seq=ctx.attempt, tool='t', outcome='ok')\n"
        "    ctx.notice('seen', f'attempt {ctx.attempt}')\n"
        "    if not (TMP / 'second').exists():\n"
        "        (TMP / 'second').write_text('')\n"
        "        os._exit(3)\n"
        "    return 'done'\n"
        "@pipeline\ndef p():\n    return dies()\n")
    res = subprocess.run([sys.executable, "-m", "ledgerflow", "run", str(flow), "--store",
                          ledger, "--executor", "inline"], capture_output=True, text=True)
    assert res.returncode == 3
    run_id = ledgerflow.runs(store=ledger)[0].run_id
    again = subprocess.run([sys.executable, "-m", "ledgerflow", "resume", run_id, "--store",
                            ledger, "--executor", "inline"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    run = ledgerflow.get_run(run_id, store=ledger)
    assert [(c["attempt"], c["input_tokens"]) for c in run.model_calls()] == [(1, 7), (2, 7)]
    assert [c["attempt"] for c in run.tool_calls()] == [1, 2]
    assert [n["message"] for n in run.notices() if n["kind"] == "seen"] == ["attempt 1",
                                                                          "attempt 2"]
    assert run.usage()["totals"]["tokens"] == 20        # the lost attempt's spend counts


def test_context_model_is_the_agents_plugin_model_call() -> None:
    from ledgerflow.context import context_method
    from ledgerflow_agents import MockModel
    from ledgerflow_agents.calls import model_call
    assert context_method("model") is model_call
    assert context().model("hi", model=MockModel(turns=[{"text": "hello"}])).text == "hello"
