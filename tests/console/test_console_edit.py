"""The console approves a tool call with edited arguments (issue 33, as ``pipeline approve
--arguments`` since 37ffe72): a JSON field in the approve form of a request whose row says
``editable``, checked server-side by the same checks (400 with the message, nothing
recorded); and a page that holds only an approver's token shows no cancel or resume button.

Real ``pipeline`` subprocesses, a real console on 127.0.0.1, real HTTP requests, and Debian's
chromium driven by Playwright.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from tests.console.conftest import pipeline_cli

pytestmark = pytest.mark.subprocess

AGENT = '''
from ledgerflow import pipeline
from ledgerflow_agents import MockModel, agent_task, tool

@tool
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b

mock = MockModel(turns=[{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
                        {"text": "done"}], cursor="step")

@agent_task(model=mock, tools=[add], approve=["add"], retries=0)
def adder(question: str) -> str:
    return question

@pipeline
def sums():
    return adder("what is 1 + 2?")
'''


@pytest.fixture
def waiting(tmp_path: Path) -> tuple[str, str]:
    """A run whose agent waits for the approval of ``add(a=1, b=2)``."""
    flow = tmp_path / "agent.py"
    flow.write_text(AGENT)
    ledger = str(tmp_path / "ledger.duckdb")
    proc = pipeline_cli("run", f"{flow}:sums", "--store", ledger, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    return ledger, proc.stdout.split()[1]


def _request(con: Any, rid: str) -> dict[str, Any]:
    status, rows = con.get(f"api/runs/{rid}/approvals")
    assert status == 200 and len(rows) == 1, rows
    return rows[0]  # type: ignore[no-any-return]


def _edits(rid: str, ledger: str) -> list[Any]:
    return [c["edit"] for c in ledgerflow.get_run(rid, store=ledger).tool_calls()]


def test_approve_with_edited_arguments_is_checked_then_runs_the_tool_with_them(
        waiting: tuple[str, str], console_factory: Any) -> None:
    ledger, rid = waiting
    con = console_factory(ledger, "--allow-actions")
    req = _request(con, rid)
    assert req["editable"] is True and req["state"] == "pending"
    url, body = f"api/runs/{rid}/approve", {"task_key": "adder", "digest": req["digest"]}

    for bad, why in [({"a": "two", "b": 2}, "a must be integer"),
                     ({"a": 1}, "missing argument(s) b"),
                     ({"a": 1, "b": 2, "c": 3}, "unknown argument(s) c"),
                     ('{"a": 1, "b": 2', "must be a JSON object"),
                     ([1, 2], "must be a JSON object")]:
        status, doc = con.post(url, {**body, "arguments": bad}, token=con.token)
        assert status == 400, (bad, doc)
        assert why in doc["error"] and doc["hint"], doc
    status, doc = con.post(f"api/runs/{rid}/reject",
                           {**body, "reason": "no", "arguments": {"a": 5, "b": 2}},
                           token=con.token)
    assert status == 400 and "reject takes no arguments" in doc["error"], doc
    still = _request(con, rid)
    assert still["state"] == "pending" and not still.get("decided_by")   # nothing recorded

    status, doc = con.post(url, {**body, "arguments": {"a": 5, "b": 2}}, token=con.token)
    assert status == 200, doc
    assert 'approved with edited arguments {"a": 5, "b": 2}' in doc["message"]
    assert f"resume it with: pipeline resume {rid}" in doc["message"]
    assert pipeline_cli("resume", rid, "--store", ledger).returncode == 0
    run = ledgerflow.get_run(rid, store=ledger)
    assert run.status().state == "succeeded"
    (call,) = run.tool_calls()
    assert call["edit"]["arguments"] == {"a": 5, "b": 2}
    assert call["edit"]["original"] == {"a": 1, "b": 2}


def test_the_page_edits_a_tool_calls_arguments_in_the_approve_form(
        waiting: tuple[str, str], console_factory: Any, page: Any, tmp_path: Path) -> None:
    expect: Any = pytest.importorskip("playwright.sync_api").expect
    ledger, rid = waiting
    con = console_factory(ledger, "--allow-actions")
    page.goto(f"{con.base}runs/{rid}?token={con.token}")
    field = page.locator("#approvals textarea")
    expect(field).to_have_count(1)
    assert json.loads(field.input_value()) == {"a": 1, "b": 2}
    field.fill('{"a": 5, "b": 2')                          # not JSON: refused there
    page.wait_for_timeout(4500)                           # the live part refreshed meanwhile
    assert field.input_value() == '{"a": 5, "b": 2'       # what was typed is kept
    approve = page.locator('#approvals tr[data-task="adder"] button', has_text="approve")
    page.once("dialog", lambda d: d.accept())
    approve.click()
    expect(page.locator("#message")).to_contain_text("must be a JSON object")
    page.screenshot(path=str(tmp_path / "edit-refused.png"), full_page=True)
    assert _request(con, rid)["state"] == "pending"

    page.locator("#approvals textarea").fill('{"a": 5, "b": 2}')
    page.once("dialog", lambda d: d.accept())
    approve.click()
    expect(page.locator("#message")).to_contain_text(
        'approved with edited arguments {"a": 5, "b": 2}')
    expect(page.locator("#message")).to_contain_text(f"pipeline resume {rid}")
    page.screenshot(path=str(tmp_path / "edit-approved.png"), full_page=True)
    decided = _request(con, rid)
    assert decided["state"] == "approved"
    assert pipeline_cli("resume", rid, "--store", ledger).returncode == 0
    assert _edits(rid, ledger)[0]["arguments"] == {"a": 5, "b": 2}


def test_an_approver_only_page_shows_no_cancel_or_resume(
        waiting: tuple[str, str], console_factory: Any, page: Any, tmp_path: Path) -> None:
    expect: Any = pytest.importorskip("playwright.sync_api").expect
    ledger, rid = waiting
    tokens = tmp_path / "tokens"
    made = pipeline_cli("console", "token", "--for", "alice", "--approver-tokens", str(tokens))
    alice = made.stdout.strip()
    con = console_factory(ledger, "--allow-actions", "--approver-tokens", str(tokens))

    page.goto(f"{con.base}runs/{rid}?token={con.token}")          # the operator's page
    head = page.locator("#live h1")
    expect(head.locator("button", has_text="cancel")).to_be_visible()
    expect(head.locator("button", has_text="resume")).to_be_visible()

    page.goto(f"{con.base}runs/{rid}#approver={alice}")            # alice's page
    expect(page.locator("#approver")).to_contain_text("deciding as alice")
    expect(page.locator("#approvals button", has_text="approve")).to_be_visible()
    expect(head.locator("button", has_text="cancel")).to_be_hidden()
    expect(head.locator("button", has_text="resume")).to_be_hidden()
    page.wait_for_timeout(4500)                                    # after a live refresh too
    expect(head.locator("button", has_text="cancel")).to_be_hidden()
    page.goto(f"{con.base}#approver={alice}")
    row = page.locator(f'#runs tr[data-run="{rid}"]')
    expect(row).to_be_visible()
    expect(row.locator("button", has_text="cancel")).to_be_hidden()
    expect(page.locator("#start")).to_be_hidden()
    page.screenshot(path=str(tmp_path / "approver-only.png"), full_page=True)

    page.locator("#approver [data-forget]").click()               # token forgotten: shown
    expect(row.locator("button", has_text="cancel")).to_be_visible()
    assert _request(con, rid)["state"] == "pending"
