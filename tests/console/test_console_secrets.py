"""Issue 31 #2 and #6: no store password on any page, reply or child command line, and no
resume log at a predictable shared path.

A real PostgreSQL server (trust authentication, so a planted password in the URL is
accepted and ignored), real ``pipeline`` processes, a real console.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres.pgserver import started_or_skip

from .conftest import cli_env, pipeline_cli, run_flow, start_console

PASSWORD = "Planted-pw-7f3a9c"

pytestmark = [pytest.mark.subprocess, pytest.mark.postgres]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A fresh ledger schema on a private server, as a URL holding a password."""
    server = started_or_skip()
    try:
        url = server.create_schema(f"lf_console_{os.getpid()}")
        yield url.replace("postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@", 1)
    finally:
        server.destroy()


def _pages(rid: str, task: str) -> list[str]:
    q = f"?task={task.replace('[', '%5B').replace(']', '%5D')}"
    return ["", "?part=live", f"runs/{rid}", f"runs/{rid}?part=live", f"runs/{rid}/items",
            f"runs/{rid}/inspect{q}", f"runs/{rid}/lineage{q}", f"runs/{rid}/graph.svg",
            f"runs/{rid}/usage", "api/runs", f"api/runs/{rid}", f"api/runs/{rid}/page",
            f"api/runs/{rid}/tasks", f"api/runs/{rid}/groups", f"api/runs/{rid}/timeline",
            f"api/runs/{rid}/attempts", f"api/runs/{rid}/lineage", f"api/runs/{rid}/notices",
            f"api/runs/{rid}/graph", f"api/runs/{rid}/logs{q}", f"api/runs/{rid}/approvals",
            f"api/runs/{rid}/usage", "api/runs/no-such-run", "runs/no-such-run", "metrics"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def test_the_store_password_is_on_no_page_reply_argv_or_table(flow: Path, tmp_path: Path,
                                                              pg_url: str) -> None:
    env = cli_env()
    env["LEDGERFLOW_STORE"] = pg_url
    rid = pipeline_cli("run", f"{flow}:broken", env=env).stdout.split()[1]
    before = set(os.listdir(tempfile.gettempdir()))
    con = start_console(pg_url, tmp_path / "console.log", "--allow-actions", store_in_env=True)
    try:
        assert PASSWORD not in _cmdline(con.proc.pid)
        seen = []
        for path in _pages(rid, "boom[3]"):
            status, body = con.get(path)
            assert status in (200, 404, 501), (path, status, body)
            text = body if isinstance(body, str) else json.dumps(body)
            assert PASSWORD not in text, path
            seen.append(text)
        header = con.get("")[1]
        assert "postgresql://postgres:***@127.0.0.1" in header       # masked, still useful
        status, reply = con.post(f"api/runs/{rid}/resume", token=con.token)
        assert status == 202, reply
        assert PASSWORD not in json.dumps(reply)
        child = _cmdline(reply["pid"])
        assert PASSWORD not in child and "postgresql" not in child
        # the resume log: a new 0600 file in a private 0700 folder with an unpredictable name
        log = Path(reply["log"])
        folder = log.parent
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert folder.name not in ("ledgerflow-console", "console")
        assert not (Path(tempfile.gettempdir()) / "ledgerflow-console").exists()
        deadline = time.monotonic() + 90
        while _cmdline(reply["pid"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert PASSWORD not in log.read_text()
        # a second resume's reply and errors: no password either
        status, again = con.post(f"api/runs/{rid}/resume", token=con.token)
        assert PASSWORD not in json.dumps(again)
        assert PASSWORD not in (tmp_path / "console.log").read_text()
    finally:
        con.stop()
    made = set(os.listdir(tempfile.gettempdir())) - before
    shutil.rmtree(folder, ignore_errors=True)          # the console's private log folder
    assert all(re.fullmatch(r"ledgerflow-console-\w+", m) or not m.startswith("ledgerflow")
               for m in made), made
    # the ledger's own tables
    import psycopg
    with psycopg.connect(pg_url.split("?")[0]) as db:
        schema = pg_url.rsplit("%3D", 1)[1]
        tables = [r[0] for r in db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,)).fetchall()]
        assert tables
        for t in tables:
            for row in db.execute(f'SELECT * FROM "{schema}"."{t}"').fetchall():
                assert PASSWORD not in repr(row), t


def test_a_planted_symlink_at_the_old_fixed_path_is_never_followed(flow: Path, tmp_path: Path,
                                                                   pg_url: str) -> None:
    """Another user's symlink where the console once wrote its logs: nothing is appended."""
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    fixed = Path(tempfile.gettempdir()) / "ledgerflow-console"
    if fixed.exists() or fixed.is_symlink():
        pytest.skip(f"{fixed} exists already on this machine")
    fixed.mkdir()
    try:
        (fixed / "console").symlink_to(tmp_path)     # the attacker's folder
        env = cli_env()
        env["LEDGERFLOW_STORE"] = pg_url
        rid = run_flow(flow, "broken", pg_url, env=env)
        con = start_console(pg_url, tmp_path / "console.log", "--allow-actions",
                            store_in_env=True)
        try:
            status, reply = con.post(f"api/runs/{rid}/resume", token=con.token)
            assert status == 202, reply
            assert not Path(reply["log"]).is_relative_to(fixed)
        finally:
            con.stop()
        shutil.rmtree(Path(reply["log"]).parent, ignore_errors=True)
        assert victim.read_text() == "untouched\n"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("resume-")] == []
    finally:
        (fixed / "console").unlink()
        fixed.rmdir()
