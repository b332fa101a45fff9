"""Per-approver console tokens: ``pipeline console token --for NAME`` makes one (stored
hashed in a 0600 file), a real console decides a gate that lists approvers as the
approver whose token came, and refuses the others (issue 33).

Real ``pipeline`` subprocesses, a real console on 127.0.0.1, real HTTP requests,
and Debian's chromium driven by Playwright for the page.
"""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path
from typing import Any

import pytest

from ledgerflow.identity import os_user
from tests.console.conftest import pipeline_cli

pytestmark = pytest.mark.subprocess

GATED = '''
from ledgerflow import Approval, pipeline, task

@task(approve=Approval(approvers=["alice"]))
def publish(n: int) -> int:
    return n

@pipeline
def gated(n: int = 3):
    return publish(n)
'''


def _new_token(tokens: Path, name: str) -> str:
    proc = pipeline_cli("console", "token", "--for", name, "--approver-tokens", str(tokens))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture
def gate(tmp_path: Path) -> tuple[str, str, dict[str, Any], Path, dict[str, str]]:
    """A run waiting at a gate only alice may decide, and tokens for alice and bob."""
    flow = tmp_path / "gated.py"
    flow.write_text(GATED)
    ledger = str(tmp_path / "ledger.duckdb")
    proc = pipeline_cli("run", f"{flow}:gated", "--store", ledger, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    rid = proc.stdout.split()[1]
    tokens = tmp_path / "tokens"
    names = {name: _new_token(tokens, name) for name in ("alice", "bob")}
    return ledger, rid, {}, tokens, names


def _pending(con: Any, rid: str) -> dict[str, Any]:
    status, rows = con.get(f"api/runs/{rid}/approvals")
    assert status == 200 and len(rows) == 1, rows
    return rows[0]


def _secrets_nowhere(tokens: dict[str, str], *places: Path) -> None:
    for place in places:
        files = [place] if place.is_file() else [f for f in place.rglob("*") if f.is_file()]
        for f in files:
            data = f.read_bytes()
            for name, tok in tokens.items():
                assert tok.encode() not in data, f"{name}'s token is in {f}"


def test_a_token_is_printed_once_and_stored_only_hashed_in_a_private_file(
        tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    alice = _new_token(tokens, "alice")
    assert len(alice) >= 32
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    text = tokens.read_text()
    assert alice not in text
    assert text == f"alice: {hashlib.sha256(alice.encode()).hexdigest()}\n"
    assert _new_token(tokens, "alice") != alice          # fresh each time, both kept
    assert len(tokens.read_text().splitlines()) == 2

    revoked = pipeline_cli("console", "token", "--for", "alice", "--revoke",
                           "--approver-tokens", str(tokens))
    assert revoked.returncode == 0 and "revoked 2" in revoked.stderr
    assert tokens.read_text() == ""
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600


def test_a_tokens_file_others_may_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    _new_token(tokens, "alice")
    tokens.chmod(0o644)
    before = tokens.read_text()
    for args in (["console", "token", "--for", "bob"],
                 ["console", "--allow-actions", "--port", "0", "--store",
                  str(tmp_path / "ledger.duckdb")]):
        proc = pipeline_cli(*args, "--approver-tokens", str(tokens), check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "open to group or others (mode 0644)" in proc.stderr
        assert f"Hint: chmod 600 {tokens}" in proc.stderr
        assert "console:" not in proc.stdout                # nothing served
    assert tokens.read_text() == before
    assert not (tmp_path / "ledger.duckdb").exists()        # refused before the ledger opened
    bad = pipeline_cli("console", "token", "--for", "a:b", "--approver-tokens",
                       str(tmp_path / "other"), check=False)
    assert bad.returncode == 2 and "cannot be an approver name" in bad.stderr
    assert not (tmp_path / "other").exists()


def test_an_approver_token_decides_as_its_approver_and_only_where_listed(
        gate: Any, console_factory: Any, tmp_path: Path) -> None:
    ledger, rid, _, tokens, tok = gate
    con = console_factory(ledger, "--allow-actions", "--approver-tokens", str(tokens))
    req = _pending(con, rid)
    body = {"task_key": req["task_key"], "digest": req["digest"]}
    url = f"api/runs/{rid}/approve"

    def bearer(t: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {t}"}

    status, doc = con.post(url, body, headers=bearer(tok["bob"]))       # not listed
    assert status == 403, doc
    assert doc["error"] == "'bob' may not approve 'publish'; its approvers are: alice"
    status, doc = con.post(f"api/runs/{rid}/reject", {**body, "reason": "no"},
                           headers=bearer(tok["bob"]))
    assert status == 403 and "may not reject" in doc["error"]
    status, doc = con.post(url, body, headers=bearer("not-a-token-of-anyone"))
    assert status == 403 and doc["error"] == "unknown approver token", doc
    status, doc = con.post(url, body, token=tok["bob"])      # the other header: same answer
    assert status == 403 and "'bob' may not approve" in doc["error"]
    status, doc = con.post(url, {**body, "as": "bob"}, headers=bearer(tok["alice"]))
    assert status == 403 and "cannot decide as 'bob'" in doc["error"]
    status, doc = con.post(f"api/runs/{rid}/cancel", headers=bearer(tok["alice"]))
    assert status == 403 and "decides approvals only" in doc["error"]
    status, doc = con.post(url, body, token=con.token)    # the console's own user: not listed
    assert status == 403 and f"{os_user()!r} may not approve" in doc["error"]
    still = _pending(con, rid)
    assert still["state"] == "pending" and not still.get("decided_by")

    status, doc = con.request("GET", "api/whoami", headers=bearer(tok["alice"]))
    assert status == 200 and doc == {"token": "approver", "decides_as": "alice"}

    status, doc = con.post(url, body, headers=bearer(tok["alice"]))
    assert status == 200, doc
    assert doc["message"].startswith(f"publish of run {rid} approved by alice; resume it with")
    decided = _pending(con, rid)
    assert decided["state"] == "approved" and decided["decided_by"] == "alice"
    cli = pipeline_cli("status", rid, "--store", ledger)
    assert "alice" in cli.stdout

    status, page = con.get(f"runs/{rid}")
    assert status == 200 and "alice" in page
    con.stop()
    _secrets_nowhere(tok, tmp_path)     # the ledger, its folder, the console's log: nowhere


def test_the_page_approves_with_an_approver_token_from_the_url_fragment(
        gate: Any, console_factory: Any, page: Any, tmp_path: Path) -> None:
    expect: Any = pytest.importorskip("playwright.sync_api").expect
    ledger, rid, _, tokens, tok = gate
    con = console_factory(ledger, "--allow-actions", "--approver-tokens", str(tokens))
    page.goto(f"{con.base}runs/{rid}#approver={tok['alice']}")
    expect(page.locator("#approver")).to_contain_text("deciding as alice")
    assert tok["alice"] not in page.url                 # taken out of the address bar
    assert tok["alice"] not in page.content()
    row = page.locator('#approvals tr[data-task="publish"]')
    expect(row).to_contain_text("pending")
    page.once("dialog", lambda d: d.accept())
    row.locator("button", has_text="approve").click()
    expect(page.locator("#message")).to_contain_text("approved by alice")
    expect(row).to_contain_text("alice", timeout=20_000)       # the table follows
    page.screenshot(path=str(tmp_path / "approved-by-alice.png"), full_page=True)
    assert tok["alice"] not in page.content()
    assert _pending(con, rid)["decided_by"] == "alice"
