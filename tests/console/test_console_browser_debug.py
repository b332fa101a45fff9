"""The debugging pages in a real browser (Debian's chromium): a run with failed
attempts and their tracebacks, a 500-task fan-out's layered graph (its width measured),
an agent run on the mock model call by call, and a run started from the runs page.

Screenshots go to ``$LEDGERFLOW_SHOTS`` (default: the test's ``tmp_path``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.console.conftest import run_flow

pytestmark = pytest.mark.subprocess

expect: Any = pytest.importorskip("playwright.sync_api").expect

AGENT_FLOW = '''
from ledgerflow import pipeline
from ledgerflow_agents import MockModel, agent_task, tool

@tool
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b

MOCK = MockModel(turns=[
    {"tool_calls": [{"name": "rm_rf", "arguments": {"path": "/"}}]},
    {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}],
     "usage": {"input_tokens": 120, "output_tokens": 18}},
    {"text": "1 + 2 is 3"}])

@agent_task(model=MOCK, tools=[add], record_content=True)
def adder(question: str) -> str:
    return question

@pipeline
def agent_flow(question: str = "what is 1 + 2?"):
    return adder(question)
'''


def _shots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("LEDGERFLOW_SHOTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_failed_attempts_fan_out_graph_and_agent_calls_in_the_browser(
        flow: Path, tmp_path: Path, console_factory: Any, page: Any) -> None:
    pytest.importorskip("ledgerflow_agents")
    shots = _shots(tmp_path)
    ledger = str(tmp_path / "ledger.duckdb")
    failed = run_flow(flow, "demo", ledger, "-p", "n=5")
    agents = tmp_path / "agents.py"
    agents.write_text(AGENT_FLOW)
    agent = run_flow(agents, "agent_flow", ledger, "--executor", "inline")
    big = run_flow(flow, "demo", ledger, "-p", "n=500")
    con = console_factory(ledger, "--allow-actions")

    # a run whose task failed twice: each attempt's traceback, the parameters
    page.goto(con.url.replace("/?", f"/runs/{failed}?"))
    expect(page.locator("#run-params")).to_contain_text("n")
    page.locator('#timeline rect.attempt[data-task="flaky"][data-attempt="1"]').click()
    tb = page.locator('#inspector details.traceback[data-attempt="1"]')
    expect(tb).to_have_attribute("open", "")
    expect(tb.locator("pre")).to_contain_text("ValueError: attempt 1 fails")
    expect(page.locator('#inspector details.traceback[data-attempt="2"] pre')).to_be_hidden()
    expect(page.locator("#logs")).to_contain_text("flaky attempt 1")
    page.locator("#inspector").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "failed-attempt.png"), full_page=True)

    # 500 items: three layers, the fan-out one node, no wider than the page
    page.goto(con.url.replace("/?", f"/runs/{big}?"))
    svg = page.locator("#graph svg#graph-svg")
    expect(svg).to_be_visible(timeout=20_000)
    box = svg.bounding_box()
    assert box is not None and box["width"] <= 1220, box
    expect(page.locator("#graph g.node")).to_have_count(3)
    square = page.locator('#graph g.node[data-key="square"]')
    expect(square).to_have_attribute("data-tasks", "500")
    square.click()
    expect(page.locator("#item-rows tbody tr")).to_have_count(100)
    page.locator("#graph").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "fan-out-500.png"), full_page=True)

    # the agent run: every call, the refusal, arguments and results, usage in plain words
    page.goto(con.url.replace("/?", f"/runs/{agent}?"))
    usage = page.locator("#usage")
    expect(usage.locator("details.call")).to_have_count(5, timeout=20_000)
    expect(usage).to_contain_text("input tokens")
    refused = usage.locator('details.call[data-outcome="refused"]')
    refused.locator("summary").click()
    expect(refused.locator("pre.arguments")).to_have_text('{"path": "/"}')
    expect(refused.locator("pre.result")).to_contain_text("not allowed")
    last = usage.locator('details.call[data-kind="model"]').last
    last.locator("summary").click()
    expect(last.locator("pre.answer")).to_have_text("1 + 2 is 3")
    usage.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "agent-run.png"), full_page=True)

    # start a run from the runs page, with a parameter
    page.goto(con.url)
    page.locator("#start summary").click()
    page.locator("#start select[name=target]").select_option(f"{flow}:demo")
    page.locator("#start textarea[name=params]").fill("n=4")
    page.once("dialog", lambda d: d.accept())
    page.locator("#start button").click()
    expect(page.locator("#message")).to_contain_text("started", timeout=30_000)
    expect(page.locator("#runs tbody tr")).to_have_count(4, timeout=60_000)
    expect(page.locator("#runs tbody tr").first).to_contain_text("n=4")
    page.screenshot(path=str(shots / "runs-started.png"), full_page=True)
