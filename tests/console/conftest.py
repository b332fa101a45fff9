"""Fixtures for the console tests: pipelines, runs made by the real CLI, a console
process on a free port, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the console needs the 'console' extra")
pytest.importorskip("uvicorn", reason="the console needs the 'console' extra")

PIPELINE = [sys.executable, "-m", "ledgerflow"]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]

FLOWS = '''
import os, time
from pathlib import Path
from ledgerflow import task, pipeline, context

@task(retries=2)
def flaky(n: int) -> int:
    print(f"flaky attempt {context().attempt}")
    if context().attempt <= 2:
        raise ValueError(f"attempt {context().attempt} fails")
    return n

@task
def square(x: int) -> int:
    return x * x

@task
def total(xs: list[int], base: int) -> int:
    return sum(xs) + base

@pipeline
def demo(n: int = 5):
    return total(square.map(list(range(n))), flaky(n))

@task
def boom(x: int) -> int:
    if x == 3 and not Path(__file__).with_name("boom.fixed").exists():
        raise ZeroDivisionError("x is 3")
    return x

@task
def after(x: int) -> int:
    return x

@pipeline
def broken(n: int = 6):
    return after.map(boom.map(list(range(n))))

@task(cache=False)
def sleepy(i: int) -> int:
    ctx = context()
    for _ in range(1200):
        ctx.raise_if_cancelled()
        time.sleep(0.05)
    return i

@pipeline
def slow(n: int = 2):
    return sleepy.map(list(range(n)))
'''


def cli_env() -> dict[str, str]:
    """The environment for CLI subprocesses: no inherited ledger settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def pipeline_cli(*args: str, env: dict[str, str] | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` to completion in a subprocess."""
    proc = subprocess.run([*PIPELINE, *args], capture_output=True, text=True,
                          env=env or cli_env(), timeout=120)
    if check and proc.returncode not in (0, 1):
        raise AssertionError(f"pipeline {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def run_flow(flow: Path, name: str, ledger: str, *extra: str,
             env: dict[str, str] | None = None) -> str:
    """``pipeline run flow.py:NAME``; return the run id it printed first."""
    out = pipeline_cli("run", f"{flow}:{name}", "--store", ledger, *extra, env=env).stdout
    return out.split()[1]


@dataclass
class Console:
    """A ``pipeline console`` subprocess and the URL it printed."""

    proc: subprocess.Popen[str]
    url: str
    base: str
    token: str
    port: int
    log: Path

    def get(self, path: str, *, host: str | None = None) -> tuple[int, Any]:
        """GET ``path``; return the status and the parsed JSON (or text)."""
        return self.request("GET", path, host=host)

    def post(self, path: str, body: dict[str, Any] | None = None, *, token: str | None = None,
             host: str | None = None, origin: str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """POST JSON to an action with this token (none by default)."""
        return self.request("POST", path, body=body or {}, token=token, host=host,
                            origin=origin, headers=headers)

    def request(self, method: str, path: str, *, body: dict[str, Any] | None = None,
                token: str | None = None, host: str | None = None,
                origin: str | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path.lstrip("/"), data=data, method=method,
                                     headers=headers or {})
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("X-Ledgerflow-Token", token)
        if host is not None:
            req.add_header("Host", host)
        if origin is not None:
            req.add_header("Origin", origin)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, raw, ctype = resp.status, resp.read(), resp.headers["content-type"]
        except urllib.error.HTTPError as exc:
            status, raw, ctype = exc.code, exc.read(), exc.headers["content-type"] or ""
        if ctype and ctype.startswith("application/json"):
            return status, json.loads(raw)
        return status, raw.decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_console(ledger: str, log: Path, *args: str, store_in_env: bool = False) -> Console:
    """Start ``pipeline console --port 0`` and wait for the URL it prints.

    ``store_in_env``: pass the ledger in ``LEDGERFLOW_STORE``, not ``--store``
    (as a URL with a password should be: argv is readable by every user).
    """
    err = open(log, "w")
    env = cli_env()
    store = ["--store", ledger]
    if store_in_env:
        env["LEDGERFLOW_STORE"], store = ledger, []
    proc = subprocess.Popen([*PIPELINE, "console", *store, "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    err.close()
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline and not line:
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
            if not line:
                break
        elif proc.poll() is not None:
            break
    sel.close()
    m = re.search(r"(http://[^\s/]+/)(\?token=(\S+))?", line)
    if m is None:
        proc.kill()
        raise AssertionError(f"console printed no URL: {line!r}\n{log.read_text()}")
    base, token = m.group(1), m.group(3) or ""
    return Console(proc=proc, url=m.group(0), base=base, token=token,
                   port=int(base.rsplit(":", 1)[1].rstrip("/")), log=log)


@pytest.fixture
def flow(tmp_path: Path) -> Path:
    """The test pipelines, written into ``tmp_path``."""
    path = tmp_path / "flows.py"
    path.write_text(FLOWS)
    return path


@pytest.fixture
def console_factory(tmp_path: Path) -> Iterator[Any]:
    """Start consoles on a ledger; all of them are stopped after the test."""
    started: list[Console] = []

    def start(ledger: str, *args: str) -> Console:
        c = start_console(ledger, tmp_path / f"console-{len(started)}.log", *args)
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium, headless, driven by Playwright (one per test module: Playwright's
    event loop must not outlive the module, later tests run their own)."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="the browser tests need playwright (dev extra)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (./dev does)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser page that records script errors (a test fails on any)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.script_errors = errors
    yield pg
    ctx.close()
    assert not errors, f"script errors on the page: {errors}"
