"""Starting a run of a known pipeline from the console: token-protected, only targets
already run in the ledger, parameters typed as ``-p`` types them, 400 on bad input."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.console.conftest import pipeline_cli, run_flow

pytestmark = pytest.mark.subprocess


def test_start_a_run_of_a_known_pipeline_with_typed_parameters(
        flow: Path, tmp_path: Path, console_factory: Any) -> None:
    ledger = str(tmp_path / "ledger.duckdb")
    first = run_flow(flow, "demo", ledger, "-p", "n=2")
    ro = console_factory(ledger)
    body = {"target": f"{flow}:demo", "params": {"n": "3"}}
    assert ro.post("api/start", body)[0] == 403                       # read-only console
    con = console_factory(ledger, "--allow-actions")
    assert con.post("api/start", body)[0] == 403                      # no token
    assert con.get("api/pipelines")[1] == [{"target": f"{flow}:demo", "last_run": first}]

    status, doc = con.post("api/start", {"target": f"{flow}:broken"}, token=con.token)
    assert status == 400 and "not a pipeline run in this ledger" in doc["error"]
    assert f"{flow}:demo" in doc["hint"]
    status, doc = con.post("api/start", {"target": f"{flow}:demo", "params": {"n": "lots"}},
                           token=con.token)
    assert status == 400 and doc["error"].startswith("parameter 'n' of 'demo' must be int")
    assert doc["hint"] == "pass -p n=<int>"
    status, doc = con.post("api/start", {"target": f"{flow}:demo", "params": {"m": "1"}},
                           token=con.token)
    assert status == 400 and "has no parameter 'm'" in doc["error"]
    status, doc = con.post("api/start", {"target": f"{flow}:demo", "params": {"n": 3}},
                           token=con.token)
    assert status == 400 and "text value" in doc["error"]
    assert con.post("api/start", {"target": f"{flow}:demo", "extra": 1},
                    token=con.token)[0] == 400

    status, doc = con.post("api/start", body, token=con.token)
    assert status == 202 and doc["params"] == {"n": "3"}
    deadline = time.monotonic() + 90
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = con.get("api/runs")[1]
        if len(runs) == 2 and runs[0]["state"] == "succeeded":
            break
        time.sleep(0.5)
    assert len(runs) == 2 and runs[0]["state"] == "succeeded", runs
    assert runs[0]["params"] == {"n": 3} and runs[1]["run_id"] == first
    out = pipeline_cli("status", runs[0]["run_id"], "--store", ledger).stdout
    assert "square" in out
