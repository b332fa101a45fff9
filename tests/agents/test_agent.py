"""Agent tasks on the mock model: governance, budgets, limits, replay, what the ledger shows."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import context, pipeline, task
from ledgerflow.errors import ConfigError, DefinitionError, PluginError
from ledgerflow_agents import (
    Arg,
    Budget,
    KeyLimits,
    MockModel,
    Pricing,
    agent_task,
    model_call,
    tool,
)
from ledgerflow_agents.budget import FileBudgetLedger, Scope


@tool
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@tool(writes=[Arg("out")])
def save(path: Path, text: str, *, out: str) -> str:
    """Write text to a file in the output folder."""
    with open(path, "a") as fh:
        fh.write(text + "\n")
    return f"saved {path.name}"


@tool(reads=[Arg("out")])
def peek(path: Path, *, out: str) -> str:
    """Read a file of the output folder (and, sneakily, another one)."""
    with open("/etc/hostname") as fh:      # outside its roots: the guard refuses it
        fh.read()
    return path.read_text()


def _store(tmp_path: Path) -> str:
    return str(tmp_path / "ledger.duckdb")


def _notices(run: Any, kind: str) -> list[dict[str, Any]]:
    return [n for n in run.notices() if n["kind"] == kind]


# -- governance: allowlist, roots, the runtime guard -----------------------------------------

def test_a_forbidden_tool_call_goes_back_to_the_model_which_can_correct_it(
        tmp_path: Path) -> None:
    mock = MockModel(turns=[{"tool_calls": [{"name": "rm_rf", "arguments": {"path": "/"}}]},
                            {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
                            {"text": "3"}])

    @agent_task(model=mock, tools=[add])
    def sneaky(question: str) -> str:
        return question

    @pipeline
    def flow():
        return sneaky("clean up")

    run = flow.run(store=_store(tmp_path))
    assert run.status().tasks["sneaky"].state == "succeeded" and run.result() == "3"
    assert [(c["tool"], c["outcome"]) for c in run.tool_calls()] == [("rm_rf", "refused"),
                                                                     ("add", "ok")]
    (n,) = _notices(run, "tool_not_allowed")
    assert "'rm_rf'" in n["message"] and "correction 1 of 2" in n["message"]
    told = [m for m in mock.requests[1]["request"]["messages"] if m["role"] == "tool"]
    assert told[0]["content"].startswith("error: refused: the model called tool 'rm_rf'")


def test_a_forbidden_tool_call_past_the_corrections_fails_the_task_at_once(
        tmp_path: Path) -> None:
    rm = {"tool_calls": [{"name": "rm_rf", "arguments": {"path": "/"}}]}
    mock = MockModel(turns=[rm, rm, rm, {"text": "never reached"}])

    @agent_task(model=mock, tools=[add], retries=3)
    def sneaky(question: str) -> str:
        return question

    @pipeline
    def flow():
        return sneaky("clean up")

    run = flow.run(store=_store(tmp_path))
    row = run.status().tasks["sneaky"]
    assert row.state == "failed" and row.attempts == 1          # not retried
    assert "ToolNotAllowed" in row.error
    assert "(not retryable)" in run.events("sneaky")[-1]["reason"]
    assert len(_notices(run, "tool_not_allowed")) == 3
    assert [(c["tool"], c["outcome"]) for c in run.tool_calls()] == [("rm_rf", "refused")] * 3
    assert len(mock.requests) == 3
    # only the allowed tool's schema was sent
    assert [t["name"] for t in mock.requests[0]["request"]["tools"]] == ["add"]


def test_a_path_outside_the_roots_is_refused_before_the_tool_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    mock = MockModel(turns=[{"tool_calls": [{"name": "save", "arguments": {
        "path": "../escaped.txt", "text": "x"}}]}])

    @agent_task(model=mock, tools=[save], corrections=0)
    def writer(question: str, out: str) -> str:
        return question

    @pipeline
    def flow(out: str):
        return writer("write it", out)

    run = flow.run(str(out), store=_store(tmp_path))
    assert run.status().tasks["writer"].state == "failed"
    (n,) = _notices(run, "path_not_allowed")
    assert "../escaped.txt" in n["message"]
    assert not (tmp_path / "escaped.txt").exists()


def test_the_guard_refuses_what_a_tool_touches_outside_its_roots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("hello")
    mock = MockModel(turns=[{"tool_calls": [{"name": "peek", "arguments": {"path": "a.txt"}}]}])

    @agent_task(model=mock, tools=[peek], corrections=0)
    def reader(question: str, out: str) -> str:
        return question

    @pipeline
    def flow(out: str):
        return reader("read a.txt", out)

    run = flow.run(str(out), store=_store(tmp_path))
    assert run.status().tasks["reader"].state == "failed"
    (n,) = _notices(run, "path_not_allowed")
    assert "/etc/hostname" in n["message"] and "may not read" in n["message"]


def test_bad_arguments_go_back_to_the_model_which_can_fix_them(tmp_path: Path) -> None:
    mock = MockModel(turns=[
        {"tool_calls": [{"name": "add", "arguments": {"a": "two", "b": 3}}]},
        {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
        {"text": "5"}])

    @agent_task(model=mock, tools=[add])
    def adder(question: str) -> str:
        return question

    assert adder("2 + 3?") == "5"                      # outside a run: a plain call
    tool_msgs = [m for m in mock.requests[1]["request"]["messages"] if m["role"] == "tool"]
    assert tool_msgs[0]["content"].startswith("error: invalid arguments: a:")


# -- budgets ------------------------------------------------------------------------------

def _two_turns() -> list[dict[str, Any]]:
    return [{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}, {"text": "3"}]


RUN_BUDGET = 2000


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_twenty_agents_sharing_a_run_budget_never_spend_more(tmp_path: Path,
                                                               executor: str) -> None:
    mock = MockModel(turns=_two_turns(), cursor="conversation", log=tmp_path / "mock.jsonl")
    fanned = agent_task(model=mock, tools=[add], max_output_tokens=40,
                        run_budget=Budget(tokens=RUN_BUDGET), name="fanned")(_question)

    @pipeline
    def fan(n: int = 20):
        return fanned.map([f"what is 1 + 2, question {i}?" for i in range(n)])

    run = fan.run(store=_store(tmp_path), executor=executor, workers=8)
    states = [t.state for t in run.status().tasks.values() if t.task_name == "fanned"]
    calls = [c for c in run.model_calls() if not c["replayed"]]
    spent = sum(c["input_tokens"] + c["output_tokens"] for c in calls)
    assert spent <= RUN_BUDGET
    assert spent == run.usage()["totals"]["tokens"]
    assert states.count("succeeded") >= 3 and states.count("failed") >= 3, states
    assert len(_notices(run, "budget_exceeded")) == states.count("failed")
    # every call reserved its worst case first: no single call spent more than it reserved
    assert all(c["input_tokens"] + c["output_tokens"] <= c["reserved_tokens"] for c in calls)
    # the budget ledger agrees with the ledger's settled usage, and nothing stays reserved
    view = run.status()
    ledger = FileBudgetLedger(str(tmp_path / "ledger.duckdb.d"),
                              str(tmp_path / "ledger.duckdb.d" / "runs" / view.run_id))
    usage = ledger.usage(Scope("run", view.run_id, Budget(tokens=RUN_BUDGET)))
    assert usage["spent"]["tokens"] == spent and usage["open"] == 0


def _question(question: str) -> str:
    """Answer the question; use the add tool for sums."""
    return question


def test_a_task_budget_on_model_calls_and_tool_calls(tmp_path: Path) -> None:
    mock = MockModel(turns=[{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]}] * 5)

    @agent_task(model=mock, tools=[add], budget=Budget(tool_calls=2))
    def looping(question: str) -> str:
        return question

    @pipeline
    def flow():
        return looping("loop")

    run = flow.run(store=_store(tmp_path))
    assert run.status().tasks["looping"].state == "failed"
    (n,) = _notices(run, "budget_exceeded")
    assert "2 tool calls of 2 tool calls" in n["message"]
    assert [c["outcome"] for c in run.tool_calls()] == ["ok", "ok", "refused"]


def test_a_usd_budget_counts_the_price_and_a_response_past_its_reservation_fails(
        tmp_path: Path) -> None:
    price = Pricing.per_million(input=1000.0, output=2000.0)    # $0.001 / $0.002 per token
    mock = MockModel(turns=[{"fault": "oversize"}], pricing=price)

    @agent_task(model=mock, budget=Budget(usd=0.05), max_output_tokens=20)
    def pricey(question: str) -> str:
        return question

    @pipeline
    def flow():
        return pricey("hi")

    run = flow.run(store=_store(tmp_path))
    assert run.status().tasks["pricey"].state == "failed"
    (call,) = run.model_calls()
    assert call["output_tokens"] == 40 and call["reserved_cost"] < call["cost"]
    assert _notices(run, "over_reservation") and _notices(run, "budget_exceeded")


# -- per-key limits ------------------------------------------------------------------------

def test_a_429_with_retry_after_is_waited_for(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LF_TEST_KEY", "sk-not-a-real-key")
    mock = MockModel(turns=[{"fault": "rate_limit", "retry_after": 1.0}, {"text": "ok"}])

    @agent_task(model=mock, key="LF_TEST_KEY", limits=KeyLimits(concurrent=2))
    def polite(question: str) -> str:
        return question

    @pipeline
    def flow():
        return polite("hi")

    run = flow.run(store=_store(tmp_path))
    assert run.result() == "ok"
    assert run.status().tasks["polite"].attempts == 1       # waited inside the attempt
    first, second = mock.requests
    assert second["at"] - first["at"] >= 1.0                 # Retry-After respected
    assert [c["finish_reason"] for c in run.model_calls()] == ["rate_limited", "stop"]
    assert all(c["key_alias"] == "LF_TEST_KEY" for c in run.model_calls())
    (n,) = _notices(run, "rate_limited")
    assert "waits 1s" in n["message"]


# -- replay ----------------------------------------------------------------------------------

def test_a_retry_replays_recorded_calls_and_runs_no_tool_twice(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    mock = MockModel(turns=[
        {"tool_calls": [{"name": "save", "arguments": {"path": "a.txt", "text": "one"}}]},
        {"fault": "error", "message": "the provider broke", "retryable": False},
        {"text": "saved"}])

    @agent_task(model=mock, tools=[save], retries=1, retry_delay=0.0)
    def keeper(question: str, out: str) -> str:
        return question

    @pipeline
    def flow(out: str):
        return keeper("save one", out)

    run = flow.run(str(out), store=_store(tmp_path))
    assert run.result() == "saved"
    assert (out / "a.txt").read_text() == "one\n"               # the tool ran once
    digests = [r["digest"] for r in mock.requests]
    assert len(digests) == 3 and digests[0] != digests[1] == digests[2]
    replayed = [(c["seq"], c["replayed"]) for c in run.model_calls() if c["attempt"] == 2]
    assert replayed == [(1, True), (3, False)]
    assert [c["replayed"] for c in run.tool_calls()] == [False, True]
    assert run.usage()["totals"]["replayed"] == 1


def test_a_changed_request_stops_the_replay_there(tmp_path: Path) -> None:
    mock = MockModel(turns=[{"text": "first"}, {"text": "second"}])
    marker = tmp_path / "marker"

    @task(retries=1)
    def twice() -> str:
        ctx = context()
        a = ctx.model("one", model=mock).text
        b = ctx.model("two" if not marker.exists() else "changed", model=mock).text
        if not marker.exists():
            marker.write_text("")
            raise RuntimeError("fail after both calls")
        return a + "+" + b

    @pipeline
    def flow():
        return twice()

    with pytest.raises(ledgerflow.errors.TaskFailedError):   # script exhausted on call 3
        flow.run(store=_store(tmp_path)).result("twice")
    assert [r["turn"] for r in mock.requests] == [0, 1, 2]    # call 1 replayed, 2 made again
    run = ledgerflow.runs(store=_store(tmp_path))[0]
    assert ledgerflow.get_run(run.run_id, store=_store(tmp_path)).notices()


# -- what is recorded -------------------------------------------------------------------------

def test_content_only_with_record_content_and_never_the_secret(tmp_path: Path,
                                                               monkeypatch) -> None:
    secret = "sk-live-0123456789abcdef-SECRET"
    monkeypatch.setenv("LF_SECRET_KEY", secret)
    turns = [{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 2}}]}, {"text": "4"}]

    @agent_task(model=MockModel(turns=turns, key_alias="LF_SECRET_KEY"), tools=[add],
                record_content=True)
    def shown(question: str) -> str:
        return question

    @agent_task(model=MockModel(turns=turns), tools=[add], key="LF_SECRET_KEY")
    def hidden(question: str) -> str:
        return question

    @pipeline
    def flow():
        return [shown("2 + 2, shown?"), hidden("2 + 2, hidden?")]

    run = flow.run(store=_store(tmp_path))
    assert run.result() == ["4", "4"]
    calls = {(c["task_key"], c["seq"]): c for c in run.model_calls()}
    assert "2 + 2, shown?" in calls[("shown", 1)]["content"]
    assert calls[("hidden", 1)]["content"] == "" and calls[("hidden", 3)]["content"] == ""
    assert {c["key_alias"] for c in calls.values()} == {"LF_SECRET_KEY"}
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    dumped = json.dumps([run.lineage(), run.logs(), run.usage(), run.notices()], default=str)
    assert secret not in dumped


def test_context_model_in_a_plain_task_is_budgeted_and_recorded(tmp_path: Path) -> None:
    mock = MockModel(turns=[{"text": "a summary", "usage": {"input_tokens": 30,
                                                            "output_tokens": 5}}])

    @task
    def summarize(text: str) -> str:
        return context().model(f"Summarize: {text}", model=mock, max_output_tokens=16,
                               budget=Budget(tokens=500)).text

    @pipeline
    def flow():
        return summarize("a long text")

    run = flow.run(store=_store(tmp_path))
    assert run.result() == "a summary"
    (call,) = run.model_calls()
    assert (call["input_tokens"], call["output_tokens"], call["seq"]) == (30, 5, 1)
    assert call["reserved_tokens"] >= 16 and call["request_hash"].startswith("sha256:")
    assert model_call("x", model=MockModel(turns=[{"text": "y"}])).text == "y"


# -- bad input, at decoration ------------------------------------------------------------------

def _prompt(q: str) -> str:
    return q


def test_bad_declarations_are_clear_errors_at_decoration(monkeypatch) -> None:
    mock = MockModel(turns=[{"text": "x"}])
    monkeypatch.delenv("LF_UNSET_KEY", raising=False)
    with pytest.raises(PluginError, match="model provider 'nope' not found"):
        agent_task(model="nope")(_prompt)
    with pytest.raises(DefinitionError, match="tokens must be a positive"):
        agent_task(model=mock, budget=Budget(tokens=0))(_prompt)
    with pytest.raises(DefinitionError, match="usd must be a positive"):
        Budget(usd=-1)
    with pytest.raises(ConfigError, match="LF_UNSET_KEY is not set"):
        agent_task(model=mock, key="LF_UNSET_KEY")(_prompt)
    def other_add(a: int) -> int:
        return a

    with pytest.raises(DefinitionError, match="duplicate tool names: add"):
        agent_task(model=mock, tools=[add, tool(name="add")(other_add)])(_prompt)
    with pytest.raises(DefinitionError, match="unknown tool"):
        agent_task(model=mock, tools=[add], approve=["save"])(_prompt)
    with pytest.raises(DefinitionError, match="unknown tool"):
        agent_task(model=mock, tools=["add"])(_prompt)

    def untyped(a, b):  # type: ignore[no-untyped-def]
        return a

    with pytest.raises(DefinitionError, match="parameter 'a' has no type hint"):
        tool(untyped)
    with pytest.raises(DefinitionError, match="a usd budget needs the model's prices"):
        agent_task(model=mock, budget=Budget(usd=1.0))(_prompt)
    with pytest.raises(DefinitionError, match="has no parameter 'out'"):
        agent_task(model=mock, tools=[save])(_prompt)
    with pytest.raises(DefinitionError, match="not a regular expression"):
        agent_task(model=mock, cite="[unclosed")(_prompt)
    with pytest.raises(DefinitionError, match="exactly one group"):
        agent_task(model=mock, cite=r"(\w+)#(\d+)")(_prompt)


def test_bad_declarations_exit_2_from_the_cli(tmp_path: Path) -> None:
    import subprocess
    import sys
    flow = tmp_path / "flow.py"
    flow.write_text("from ledgerflow import pipeline\n"
                    "from ledgerflow_agents import agent_task, Budget, MockModel\n"
                    "@agent_task(model=MockModel(turns=[]), budget=Budget(tokens=-5))\n"
                    "def a(q: str) -> str:\n    return q\n"
                    "@pipeline\ndef p():\n    return a('x')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    res = subprocess.run([sys.executable, "-m", "ledgerflow", "run", str(flow), "--store",
                          str(tmp_path / "l.duckdb")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Error:" in res.stderr and "tokens must be a positive" in res.stderr


def test_cite_asks_the_final_request_to_cite_an_id_the_tools_returned(tmp_path: Path) -> None:
    @tool
    def lookup(query: str) -> str:
        """Look passages up."""
        return "[a.md#1] one\n[b.md#3] two"

    mock = MockModel(turns=[{"tool_calls": [{"name": "lookup", "arguments": {"query": "x"}}]},
                            {"text": "Two [b.md#3]."}])

    @agent_task(model=mock, tools=[lookup], cite=r"\[([^\]\s]+#\d+)\]")
    def citer(question: str) -> str:
        return question

    @pipeline
    def flow():
        return citer("which?")

    assert flow.run(store=_store(tmp_path)).result() == "Two [b.md#3]."
    sent = [r["request"].get("cite_from") for r in mock.requests]
    assert sent == [None, ["a.md#1", "b.md#3"]]
