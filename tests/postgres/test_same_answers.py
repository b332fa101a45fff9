"""One pipeline with a model call, a tool call, an approval and a step, run on the DuckDB,
PostgreSQL and memory stores: every store answers ``lineage``, ``attempts``,
``approvals``, ``usage`` and ``logs`` alike (ids and times normalised)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import context, pipeline, task
from ledgerflow_agents import MockModel, agent_task, tool

pytestmark = pytest.mark.postgres


@tool
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


# stateless: turn N answers a conversation holding N assistant messages, on every run
MOCK = MockModel(turns=[{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}],
                         "usage": {"input_tokens": 30, "output_tokens": 6}},
                        {"text": "3", "usage": {"input_tokens": 40, "output_tokens": 1}}],
                 cursor="step")


@agent_task(model=MOCK, tools=[add], retries=0)
def ask(question: str) -> str:
    return question


@task(approve=True)
def publish(answer: str) -> str:
    print(f"publishing {answer}")
    return str(context().step("send", lambda: f"sent {answer}"))


@pipeline
def answered(question: str = "what is 1 + 2?"):
    return publish(ask(question))


_TIMES = {"requested_at", "decided_at", "started_at", "ended_at", "latency", "at", "ts",
          "duration", "deadline"}


def _norm(value: Any, ids: dict[str, str]) -> Any:
    """``value`` without times, with each of ``ids`` (the run id, approval digests,
    which bind the run) replaced by its name."""
    if isinstance(value, dict):
        return {k: _norm(v, ids) for k, v in sorted(value.items()) if k not in _TIMES}
    if isinstance(value, list):
        return [_norm(v, ids) for v in value]
    if isinstance(value, str):
        for real, name in ids.items():
            value = value.replace(real, name)
    return value


def _answers(store: str) -> dict[str, Any]:
    run = answered.run(store=store, executor="inline")
    assert run.state == "waiting"
    (req,) = run.approvals(pending_only=True)
    run.approve("publish", digest=req["digest"], by="reviewer", reason="fine")
    done = ledgerflow.resume(run.run_id, store=store, executor="inline")
    assert done.state == "succeeded" and done.result() == "sent 3"
    got = {"lineage": sorted(done.lineage(), key=lambda r: (r["task_key"], r["direction"],
                                                           r["uri"])),
           "attempts": done.attempts(), "approvals": done.approvals(),
           "usage": done.usage(), "logs": done.logs()}
    ids = {run.run_id: "RUN", req["digest"]: "DIGEST"}
    return _norm(got, ids)


def test_every_store_gives_the_same_answers(tmp_path: Path, pg_url: str) -> None:
    duck = _answers(str(tmp_path / "ledger.duckdb"))
    assert {r["direction"] for r in duck["lineage"]} >= {
        "model_call", "tool_call", "approval", "input", "output"}
    assert duck["usage"]["totals"]["model_calls"] == 2
    assert duck["usage"]["totals"]["tool_calls"] == 1
    assert [a["state"] for a in duck["approvals"]] == ["approved"]
    assert any("publishing 3" in log["text"] for log in duck["logs"])
    for name, where in (("memory", f"memory:{tmp_path}"), ("postgres", pg_url)):
        other = _answers(where)
        for what in duck:
            assert other[what] == duck[what], (name, what)
