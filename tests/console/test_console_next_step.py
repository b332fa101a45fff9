"""After a decision the decider is told what happens next (issue 33): a run whose driver
stopped stays ``waiting`` until it is resumed, and ``pipeline approve`` and the console's
reply say so with the command; a driver waiting with ``--wait-approvals`` takes the decision
itself; ``--resume`` resumes it there and then.

Real ``pipeline`` subprocesses and a real console on 127.0.0.1.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.console.conftest import PIPELINE, cli_env, pipeline_cli
from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

GATED = '''
from ledgerflow import pipeline, task

@task(approve=True)
def publish(n: int) -> int:
    return n * 2

@pipeline
def gated(n: int = 3):
    return publish(n)
'''


@pytest.fixture
def gated(tmp_path: Path) -> tuple[Path, str]:
    flow = tmp_path / "gated.py"
    flow.write_text(GATED)
    return flow, str(tmp_path / "ledger.duckdb")


def _waiting_run(flow: Path, ledger: str) -> str:
    proc = pipeline_cli("run", f"{flow}:gated", "--store", ledger, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    return proc.stdout.split()[1]


def _request(rid: str, ledger: str) -> dict[str, Any]:
    (req,) = json.loads(pipeline_cli("approvals", rid, "--store", ledger, "--json").stdout)
    return req  # type: ignore[no-any-return]


def _state(rid: str, ledger: str) -> str:
    doc = json.loads(pipeline_cli("status", rid, "--store", ledger, "--json").stdout)
    return str(doc["state"])


def test_pipeline_approve_says_the_run_waits_for_a_resume(gated: tuple[Path, str]) -> None:
    flow, ledger = gated
    rid = _waiting_run(flow, ledger)
    digest = _request(rid, ledger)["digest"][:12]
    proc = pipeline_cli("approve", rid, "publish", "--digest", digest, "--store", ledger)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith("publish: approved by ")
    assert line.endswith(f"; resume it with: pipeline resume {rid}; it stays waiting until "
                         "then")
    assert _state(rid, ledger) == "waiting"          # as it says: nothing drove it on
    assert pipeline_cli("resume", rid, "--store", ledger).returncode == 0
    assert _state(rid, ledger) == "succeeded"


def test_approve_resume_says_it_resumes_here(gated: tuple[Path, str]) -> None:
    flow, ledger = gated
    rid = _waiting_run(flow, ledger)
    digest = _request(rid, ledger)["digest"][:12]
    proc = pipeline_cli("approve", rid, "publish", "--digest", digest, "--resume",
                        "--store", ledger)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].endswith("; resuming it here")
    assert "pipeline resume" not in proc.stdout
    assert _state(rid, ledger) == "succeeded"


def test_a_driver_waiting_for_approvals_takes_the_decision(gated: tuple[Path, str],
                                                           tmp_path: Path) -> None:
    flow, ledger = gated
    out = open(tmp_path / "driver.out", "w")
    driver = subprocess.Popen([*PIPELINE, "run", f"{flow}:gated", "--store", ledger,
                               "--wait-approvals"], stdout=out, stderr=subprocess.STDOUT,
                              env=cli_env())
    try:
        rows: list[dict[str, Any]] = []

        def asked() -> bool:
            rows[:] = json.loads(pipeline_cli("approvals", "--store", ledger,
                                              "--json").stdout)
            return len(rows) == 1
        wait_until(asked, timeout=60, what="the driver's approval request")
        rid = rows[0]["run_id"]
        proc = pipeline_cli("approve", rid, "publish", "--digest", rows[0]["digest"][:12],
                            "--store", ledger)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().endswith("; its driver picks the decision up within a "
                                            "second")
        assert "pipeline resume" not in proc.stdout
        assert driver.wait(60) == 0
        assert _state(rid, ledger) == "succeeded"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        out.close()


def test_the_consoles_reply_says_what_happens_next(gated: tuple[Path, str],
                                                   console_factory: Any) -> None:
    flow, ledger = gated
    rid = _waiting_run(flow, ledger)
    con = console_factory(ledger, "--allow-actions")
    req = _request(rid, ledger)
    status, doc = con.post(f"api/runs/{rid}/approve",
                           {"task_key": "publish", "digest": req["digest"]}, token=con.token)
    assert status == 200, doc
    assert doc["message"].endswith(f"; resume it with: pipeline resume {rid}; it stays "
                                   "waiting until then")
    assert doc["decision"]["next"] == doc["message"].split("; ", 1)[1]
    assert _state(rid, ledger) == "waiting"
