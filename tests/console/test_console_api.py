"""The console's JSON endpoints and its refusals, against a real ``pipeline console``
process; documents that the CLI also prints are compared with the CLI's own output."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerflow import Run
from tests.console.conftest import (
    FLOWS,
    PIPELINE,
    Console,
    cli_env,
    pipeline_cli,
    run_flow,
    start_console,
)

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Console, str, str, str]]:
    """A ledger with a succeeded ``demo`` run and a failed ``broken`` run, and a read-only
    console on it: ``(console, ledger, demo run id, broken run id)``."""
    tmp = tmp_path_factory.mktemp("console-api")
    flow = tmp / "flows.py"
    flow.write_text(FLOWS)
    ledger = str(tmp / "ledger.duckdb")
    demo = run_flow(flow, "demo", ledger)
    broken = run_flow(flow, "broken", ledger)
    con = start_console(ledger, tmp / "console.log")
    try:
        yield con, ledger, demo, broken
    finally:
        con.stop()


def _cli_json(*args: str) -> Any:
    return json.loads(pipeline_cli(*args, "--json").stdout)


def test_runs_endpoint_is_pipeline_runs_json_plus_the_pages_columns(made: Any) -> None:
    con, ledger, demo, broken = made
    status, doc = con.get("api/runs")
    assert status == 200
    cli = _cli_json("runs", "--store", ledger)
    assert [{k: r[k] for k in cli[0]} for r in doc] == cli
    assert [r["run_id"] for r in doc] == [broken, demo]
    assert {"duration_s", "pending_approvals", "usage"} <= set(doc[0])
    assert con.get("api/runs?state=failed")[1][0]["run_id"] == broken
    assert [r["run_id"] for r in con.get("api/runs?pipeline=demo")[1]] == [demo]
    assert con.get("api/runs?pipeline=nope")[1] == []


def test_run_endpoint_is_exactly_pipeline_status_json(made: Any) -> None:
    con, ledger, demo, broken = made
    for rid in (demo, broken):
        status, doc = con.get(f"api/runs/{rid}")
        assert status == 200
        assert doc == _cli_json("status", rid, "--store", ledger)


def test_lineage_endpoint_is_pipeline_lineage_json(made: Any) -> None:
    con, ledger, demo, _ = made
    for task in ("total", "square[2]", None):
        q = f"?task={task.replace('[', '%5B').replace(']', '%5D')}" if task else ""
        status, doc = con.get(f"api/runs/{demo}/lineage{q}")
        assert status == 200
        args = ("lineage", demo, "--store", ledger) + (("--task", task) if task else ())
        assert doc == _cli_json(*args)
    total = con.get(f"api/runs/{demo}/lineage?task=total")[1]
    assert {r["uri"] for r in total if r["task_key"] == "total" and r["direction"] == "input"} \
        == {"task:flaky"} | {f"task:square[{i}]" for i in range(5)}


def test_page_endpoint_holds_what_the_run_page_shows(made: Any) -> None:
    con, _, demo, broken = made
    status, doc = con.get(f"api/runs/{demo}/page")
    assert status == 200
    assert doc["header"]["counts"] == {"succeeded": 7} and doc["header"]["total"] == 7
    groups = {g["task"]: g for g in doc["groups"]}
    assert groups["square"]["tasks"] == 5 and groups["square"]["fan_out"]
    assert groups["flaky"]["attempts"] == 3 and groups["flaky"]["retried"] == 1
    tl = doc["timeline"]
    assert tl["attempts_total"] == 9 and not tl["aggregated"]
    lane = next(x for x in tl["lanes"] if x["task_key"] == "flaky")
    assert [b["outcome"] for b in lane["bars"]] == ["error", "error", "ok"]
    assert [w["kind"] for w in lane["waits"]] == ["retry_wait", "retry_wait"]
    assert lane["bars"][0]["error"] == "ValueError: attempt 1 fails"
    starts = [b["start_ms"] for b in lane["bars"]]
    assert starts == sorted(starts) and all(b["duration_ms"] >= 0 for b in lane["bars"])

    rc = con.get(f"api/runs/{broken}/page")[1]["root_cause"]
    assert [f["key"] for f in rc["failed"]] == ["boom[3]"]
    assert rc["failed"][0]["error"] == "ZeroDivisionError: x is 3"
    assert rc["upstream_failed_total"] == 1 and rc["upstream_failed_by_task"] == {"after": 1}


def test_tasks_endpoint_pages_through_the_items_of_a_task_name(made: Any) -> None:
    con, _, demo, broken = made
    doc = con.get(f"api/runs/{demo}/tasks?task=square&offset=2&limit=2")[1]
    assert doc["total"] == 5 and [t["key"] for t in doc["tasks"]] == ["square[2]", "square[3]"]
    failed = con.get(f"api/runs/{broken}/tasks?state=failed")[1]
    assert [t["key"] for t in failed["tasks"]] == ["boom[3]"]
    status, err = con.get(f"api/runs/{demo}/tasks?offset=lots")
    assert status == 400 and "offset" in err["error"] and err["hint"]


def test_attempts_graph_and_notices_endpoints(made: Any) -> None:
    con, _, demo, _ = made
    att = con.get(f"api/runs/{demo}/attempts?task=flaky")[1]
    assert [(a["attempt"], a["outcome"]) for a in att] == [(1, "error"), (2, "error"), (3, "ok")]
    assert len(con.get(f"api/runs/{demo}/attempts")[1]) == 9
    graph = con.get(f"api/runs/{demo}/graph")[1]
    assert not graph["collapsed"] and len(graph["nodes"]) == 7
    assert {(x["from"], x["to"]) for x in graph["edges"]} == {
        ("flaky", "total")} | {(f"square[{i}]", "total") for i in range(5)}
    assert con.get(f"api/runs/{demo}/notices") == (200, [])
    status, svg = con.get(f"runs/{demo}/graph.svg")
    assert status == 200 and svg.startswith("<svg") and "square[4]" in svg


def test_panels_the_kernel_lacks_answer_501(made: Any) -> None:
    con, _, demo, _ = made
    for method, path in (("logs", "logs?task=flaky"), ("approvals", "approvals"),
                         ("usage", "usage")):
        status, doc = con.get(f"api/runs/{demo}/{path}")
        if callable(getattr(Run, method, None)):
            assert status == 200
        else:
            assert status == 501 and f"Run.{method}" in doc["error"]


def test_unknown_runs_and_tasks_are_404_and_400_with_a_hint(made: Any) -> None:
    con, _, demo, _ = made
    status, doc = con.get("api/runs/20990101-000000-nope00")
    assert status == 404 and "no run" in doc["error"] and "hint" in doc
    status, html = con.get("runs/20990101-000000-nope00")
    assert status == 404 and "Error:" in html and "no run" in html
    status, html = con.get(f"runs/{demo}/inspect?task=missing")
    assert status == 400 and "has no task" in html


def test_read_only_console_refuses_actions_and_any_other_host(made: Any) -> None:
    con, _, demo, _ = made
    status, doc = con.post(f"api/runs/{demo}/cancel")
    assert status == 403 and "read-only" in doc["error"]
    status, doc = con.get("api/runs", host=f"attacker.example:{con.port}")
    assert status == 403 and "Host" in doc["error"]
    assert con.get("api/runs", host=f"localhost:{con.port}")[0] == 200
    status, html = con.get("/")
    assert status == 200 and "read-only" in html and "data-action=" not in html


def test_actions_on_an_ended_run_say_why_not(flow: Path, tmp_path: Path,
                                             console_factory: Any) -> None:
    ledger = str(tmp_path / "ledger.duckdb")
    rid = run_flow(flow, "demo", ledger)
    con = console_factory(ledger, "--allow-actions")
    assert con.token and con.url.endswith(f"?token={con.token}")
    status, doc = con.post(f"api/runs/{rid}/cancel", token=con.token)
    assert status == 409 and "already" in doc["error"] and "succeeded" in doc["error"]
    status, doc = con.post(f"api/runs/{rid}/resume", token=con.token)
    assert status == 409 and "already succeeded" in doc["error"]
    status, doc = con.post(f"api/runs/{rid}/approve", {"task_key": "flaky"}, token=con.token)
    assert status in (400, 501) and doc["hint"]
    status, doc = con.request("POST", f"api/runs/{rid}/cancel", token=con.token,
                              body=None)
    assert status == 409          # no body at all is fine: cancel needs none


def test_console_errors_are_error_and_hint_lines(tmp_path: Path) -> None:
    proc = subprocess.run([*PIPELINE, "console", "--store", str(tmp_path)], capture_output=True,
                          text=True, env=cli_env(), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: ledger path is a directory") and "Hint:" in proc.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([*PIPELINE, "console", "--store", str(tmp_path / "l.duckdb"),
                               "--port", str(port)], capture_output=True, text=True,
                              env=cli_env(), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "--port 0" in proc.stderr


GATED = '''
from ledgerflow import pipeline, task

@task(approve=True)
def publish(x: int) -> int:
    return x

@pipeline
def gated():
    return publish(1)
'''


def test_cancel_of_a_waiting_run_nobody_drives_ends_it(tmp_path: Path,
                                                       console_factory: Any) -> None:
    from tests.waiting import wait_until
    (tmp_path / "gated.py").write_text(GATED)
    ledger = str(tmp_path / "ledger.duckdb")
    res = subprocess.run([*PIPELINE, "run", f"{tmp_path / 'gated.py'}:gated", "--store",
                          ledger], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert res.returncode == 3, res.stdout + res.stderr       # waiting for approval
    rid = res.stdout.split()[1]
    con = console_factory(ledger, "--allow-actions")
    status, doc = con.post(f"api/runs/{rid}/cancel", token=con.token)
    assert status == 200 and f"no process drives {rid}: cancelling it" in doc["message"]

    def cancelled() -> bool:
        return con.get(f"api/runs/{rid}")[1]["state"] == "cancelled"

    wait_until(cancelled, timeout=120, what="the run cancelled", every=0.5)
