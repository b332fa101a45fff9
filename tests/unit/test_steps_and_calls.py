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
