"""The console in a real browser: Debian's chromium driven by Playwright, a real
``pipeline console`` process, runs made by the real CLI in other processes.

Each test writes a screenshot of the pages it saw into its ``tmp_path``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import Run
from tests.console.conftest import PIPELINE, cli_env, pipeline_cli, run_flow
from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

expect: Any = pytest.importorskip("playwright.sync_api").expect


def _status(rid: str, ledger: str) -> dict[str, Any]:
    return json.loads(pipeline_cli("status", rid, "--store", ledger, "--json").stdout)


def test_runs_page_lists_a_new_run_and_its_page_shows_every_attempt(
        flow: Path, tmp_path: Path, console_factory: Any, page: Any) -> None:
    ledger = str(tmp_path / "ledger.duckdb")
    con = console_factory(ledger)
    page.goto(con.url)
    expect(page.locator("#runs")).to_contain_text("no runs yet")

    rid = run_flow(flow, "demo", ledger)            # another process, after the page opened
    row = page.locator(f'#runs tr[data-run="{rid}"]')
    expect(row).to_be_visible(timeout=20_000)       # the page refreshed itself
    expect(row).to_have_attribute("data-state", "succeeded")
    expect(row.locator('[data-state="succeeded"] b')).to_have_text("7")
    page.screenshot(path=str(tmp_path / "runs-page.png"), full_page=True)

    row.locator("a").click()
    expect(page.locator("h1")).to_contain_text(rid)
    expect(page.locator("#counts")).to_contain_text("7 tasks")
    expect(page.locator('#counts [data-state="succeeded"] b')).to_have_text("7")

    # one bar per attempt: flaky failed twice, then succeeded
    flaky = page.locator('#timeline rect.attempt[data-task="flaky"]')
    expect(flaky).to_have_count(3)
    assert [flaky.nth(i).get_attribute("data-outcome") for i in range(3)] == [
        "error", "error", "ok"]
    assert [flaky.nth(i).get_attribute("data-attempt") for i in range(3)] == ["1", "2", "3"]
    expect(page.locator('#timeline g.lane[data-task="flaky"] line.wait')).to_have_count(2)
    attempts = sum(t["attempts"] for t in _status(rid, ledger)["tasks"])
    assert attempts == 9
    expect(page.locator("#timeline rect.attempt")).to_have_count(attempts)
    widths = page.locator("#timeline rect.attempt").evaluate_all(
        "els => els.map(e => parseFloat(e.getAttribute('width')))")
    assert min(widths) >= 2.0               # sub-millisecond attempts stay visible

    # the fan-out is one row by task name, and expands to its items
    square = page.locator('#groups tr[data-task="square"]')
    expect(square).to_contain_text("5")
    square.locator("button").click()
    expect(page.locator("#item-rows tbody tr")).to_have_count(5)
    expect(page.locator("#item-rows")).to_contain_text("square[4]")

    # a bar opens that attempt: its error, and the task's lineage
    flaky.nth(1).click()
    expect(page.locator("#attempts tr.selected")).to_have_attribute("data-attempt", "2")
    expect(page.locator("#attempts")).to_contain_text("attempt 2 fails")
    expect(page.locator("#lineage")).to_contain_text("task:flaky")
    expect(page.locator("#graph svg")).to_be_visible()
    expect(page.locator("#graph")).to_contain_text("total")
    page.screenshot(path=str(tmp_path / "run-page.png"), full_page=True)


def test_failed_run_names_its_root_cause_and_resume_from_the_page_finishes_it(
        flow: Path, tmp_path: Path, console_factory: Any, page: Any) -> None:
    ledger = str(tmp_path / "ledger.duckdb")
    rid = run_flow(flow, "broken", ledger)
    con = console_factory(ledger, "--allow-actions")
    page.goto(f"{con.base}runs/{rid}?token={con.token}")
    rc = page.locator("#root-cause")
    expect(rc).to_contain_text("boom[3] failed by itself")
    expect(rc).to_contain_text("ZeroDivisionError: x is 3")
    expect(rc).to_contain_text("1 downstream task is upstream_failed because of it: after")
    expect(page.locator('#counts [data-state="upstream_failed"] b')).to_have_text("1")
    page.screenshot(path=str(tmp_path / "failed-run-page.png"), full_page=True)

    (flow.parent / "boom.fixed").touch()             # the bug is fixed; resume from the page
    page.once("dialog", lambda d: d.accept())
    page.locator("#live h1 button", has_text="resume").click()
    expect(page.locator("#message")).to_contain_text(f"resume of {rid} started")
    wait_until(lambda: _status(rid, ledger)["state"] == "succeeded", timeout=60,
               what="the resumed run to succeed")
    expect(page.locator("#live h1 .pill")).to_have_text("succeeded", timeout=20_000)
    expect(page.locator("#root-cause")).to_have_count(0)
    logs = list((Path(ledger + ".d") / "console").glob(f"resume-{rid}-*.log"))
    assert len(logs) == 1 and "resuming" in logs[0].read_text()
    page.screenshot(path=str(tmp_path / "resumed-run-page.png"), full_page=True)


def test_cancel_needs_the_token_and_the_consoles_own_host(
        flow: Path, tmp_path: Path, console_factory: Any, page: Any) -> None:
    ledger = str(tmp_path / "ledger.duckdb")
    con = console_factory(ledger, "--allow-actions")
    proc = subprocess.Popen([*PIPELINE, "run", f"{flow}:slow", "--store", ledger],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env())
    try:
        assert proc.stdout is not None
        rid = proc.stdout.readline().split()[1]
        wait_until(lambda: con.get(f"api/runs/{rid}")[1].get("counts", {}).get("running") == 2,
                   timeout=30, what="both tasks of the slow run to run")
        path = f"api/runs/{rid}/cancel"
        status, doc = con.post(path)                       # no token
        assert status == 403 and "token" in doc["error"]
        assert con.post(path, token="not-the-token")[0] == 403
        status, doc = con.post(path, token=con.token, host="attacker.example:80")
        assert status == 403 and "Host" in doc["error"]    # DNS rebinding
        status, doc = con.post(path, token=con.token, origin="http://attacker.example")
        assert status == 403 and "cross-site" in doc["error"]
        assert con.get(f"api/runs/{rid}")[1]["state"] == "running"   # nothing happened

        page.goto(f"{con.base}runs/{rid}?token={con.token}")
        expect(page.locator("#timeline rect.attempt.running")).to_have_count(2)
        page.screenshot(path=str(tmp_path / "running-run-page.png"), full_page=True)
        page.once("dialog", lambda d: d.accept())
        page.locator("#live h1 button.danger", has_text="cancel").click()
        expect(page.locator("#message")).to_contain_text(f"cancel requested for {rid}")
        assert proc.wait(60) == 1
        expect(page.locator("#live h1 .pill")).to_have_text("cancelled", timeout=20_000)
        page.screenshot(path=str(tmp_path / "cancelled-run-page.png"), full_page=True)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert _status(rid, ledger)["state"] == "cancelled"
    # the attempts that were stopped show as cancelled bars
    expect(page.locator('#timeline rect.attempt[data-outcome="cancelled"]')).to_have_count(2)


@pytest.mark.skipif(not callable(getattr(Run, "logs", None)),
                    reason="this ledgerflow has no Run.logs yet (issue 13)")
def test_the_logs_of_an_attempt_open(flow: Path, tmp_path: Path, console_factory: Any,
                                     page: Any) -> None:
    ledger = str(tmp_path / "ledger.duckdb")
    rid = run_flow(flow, "demo", ledger)
    con = console_factory(ledger)
    page.goto(f"{con.base}runs/{rid}")
    page.locator('#timeline rect.attempt[data-task="flaky"][data-attempt="2"]').click()
    expect(page.locator("#logs")).to_contain_text("flaky attempt 2")
    expect(page.locator("#logs")).not_to_contain_text("flaky attempt 1")
    page.screenshot(path=str(tmp_path / "logs.png"), full_page=True)


GATED = '''
from ledgerflow import task, pipeline

@task(approve=True)
def publish(n: int) -> int:
    return n

@pipeline
def gated(n: int = 3):
    return publish(n)
'''


@pytest.mark.skipif(not callable(getattr(ledgerflow, "approve", None)),
                    reason="this ledgerflow has no approvals yet (issue 15)")
def test_approve_with_the_token_moves_a_waiting_run_on(tmp_path: Path, console_factory: Any,
                                                       page: Any) -> None:
    flow = tmp_path / "gated.py"
    flow.write_text(GATED)
    ledger = str(tmp_path / "ledger.duckdb")
    proc = pipeline_cli("run", f"{flow}:gated", "--store", ledger, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    rid = proc.stdout.split()[1]
    con = console_factory(ledger, "--allow-actions")
    status, pending = con.get(f"api/runs/{rid}/approvals")
    assert status == 200 and len(pending) == 1
    body = {"task_key": pending[0]["task_key"], "digest": pending[0]["digest"]}
    assert con.post(f"api/runs/{rid}/approve", body)[0] == 403      # no token
    page.goto(f"{con.base}runs/{rid}?token={con.token}")
    row = page.locator(f'#approvals tr[data-task="{pending[0]["task_key"]}"]')
    expect(row).to_contain_text(pending[0]["digest"][:16])
    page.screenshot(path=str(tmp_path / "approvals.png"), full_page=True)
    page.once("dialog", lambda d: d.accept())
    row.locator("button", has_text="approve").click()
    expect(page.locator("#message")).to_contain_text("approved")
    status, doc = con.post(f"api/runs/{rid}/resume", token=con.token)
    assert status == 202, doc
    wait_until(lambda: _status(rid, ledger)["state"] == "succeeded", timeout=60,
               what="the approved run to succeed")
