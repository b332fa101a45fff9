"""The console's /metrics: the Prometheus text that drivers wrote for its ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import cli_env, run_flow

pytest.importorskip("prometheus_client", reason="needs the 'observability' extra")

from prometheus_client.parser import text_string_to_metric_families


def test_metrics_of_runs_driven_by_other_processes(flow: Path, tmp_path: Path,
                                                   console_factory: Any) -> None:
    ledger = str(tmp_path / "ledger.duckdb")
    env = cli_env()
    env["LEDGERFLOW_PROMETHEUS"] = "1"
    run_flow(flow, "demo", ledger, env=env)         # flaky fails twice, then succeeds
    run_flow(flow, "broken", ledger, env=env)
    console = console_factory(ledger)
    status, text = console.get("/metrics")
    assert status == 200
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert got[("ledgerflow_task_retries_total",
                (("pipeline", "demo"), ("task", "flaky")))] == 2
    assert got[("ledgerflow_runs_finished_total",
                (("pipeline", "broken"), ("state", "failed")))] == 1
    assert got[("ledgerflow_attempt_duration_seconds_count",
                (("outcome", "ok"), ("pipeline", "demo"), ("task", "square")))] == 5
    # another Host is refused here as on every page
    status, _ = console.get("/metrics", host="evil.example:80")
    assert status == 403
