"""Issue 31 #7: every console input is checked by type: 400 with a message, never a 500 and
never a damaged journal line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import pipeline_cli, start_console

GATED = '''
from ledgerflow import task, pipeline

@task(approve=True)
def publish(n: int) -> int:
    return n

@pipeline
def gated(n: int = 3):
    return publish(n)
'''

BAD_BODIES = [
    ("reject", {"task_key": "publish", "reason": {"why": "nested"}}, "reason must be a string"),
    ("reject", {"task_key": "publish", "reason": ["a", "list"]}, "reason must be a string"),
    ("reject", {"task_key": "publish", "reason": 12}, "reason must be a string"),
    ("reject", {"task_key": "publish", "reason": "x" * 5000}, "more than 2,000"),
    ("reject", {"task_key": "publish", "reason": "bad\x00line\x1b[2J"}, "control characters"),
    ("approve", {"task_key": "publish", "digest": 123}, "digest must be a string"),
    ("approve", {"task_key": "publish", "digest": {"d": 1}}, "digest must be a string"),
    ("approve", {"task_key": "publish", "digest": True}, "digest must be a string"),
    ("approve", {"task_key": 7, "digest": "abc"}, "task_key of the request as a string"),
    ("approve", {"task_key": ["publish"], "digest": "abc"}, "as a string"),
    ("approve", {"task_key": "publish", "digest": "abc", "as": {"name": "ana"}},
     "as must be a string"),
    ("approve", {"task_key": "publish", "digest": "abc", "by": "ana"}, "unknown field"),
]


def _json(*args: str) -> Any:
    return json.loads(pipeline_cli(*args, "--json").stdout)


@pytest.mark.parametrize("verb,body,says", BAD_BODIES)
def test_a_decision_field_of_the_wrong_type_is_400_and_records_nothing(
        shared_run: tuple[Any, str, str], verb: str, body: dict[str, Any], says: str) -> None:
    con, ledger, rid = shared_run
    before = con.get(f"api/runs/{rid}/approvals")[1]
    cli_before = _json("approvals", rid, "--store", ledger)
    status, doc = con.post(f"api/runs/{rid}/{verb}", body, token=con.token)
    assert status == 400, doc
    assert says in doc["error"] and doc["hint"]
    assert con.get(f"api/runs/{rid}/approvals")[1] == before
    assert _json("approvals", rid, "--store", ledger) == cli_before


def test_after_every_bad_input_the_run_still_reads_and_decides(
        gated_run: tuple[Any, str, str]) -> None:
    con, ledger, rid = gated_run
    for verb, body, _ in BAD_BODIES:
        assert con.post(f"api/runs/{rid}/{verb}", body, token=con.token)[0] == 400
    status, doc = con.post(f"api/runs/{rid}/reject",
                           {"task_key": "publish", "reason": "not today"}, token=con.token)
    assert status == 200, doc
    (row,) = con.get(f"api/runs/{rid}/approvals")[1]
    assert row["state"] == "rejected" and row["reason"] == "not today"
    res = pipeline_cli("resume", rid, "--store", ledger)
    assert res.returncode == 1, res.stdout + res.stderr
    res2 = pipeline_cli("resume", rid, "--store", ledger, check=False)     # a later resume
    assert "Traceback" not in res2.stderr
    status = _json("status", rid, "--store", ledger)
    assert status["tasks"][0]["state"] == "failed"
    doctor = pipeline_cli("doctor", "--store", ledger, check=False)
    assert "damaged" not in (doctor.stdout + doctor.stderr).lower(), doctor.stdout


@pytest.mark.parametrize("query", ["limit=abc", "offset=1.5", "rows=-", "attempt=x"])
def test_bad_query_numbers_are_400(shared_run: tuple[Any, str, str], query: str) -> None:
    con, _, rid = shared_run
    path = {"limit": "api/runs", "offset": f"api/runs/{rid}/tasks",
            "rows": f"api/runs/{rid}/timeline", "attempt": f"api/runs/{rid}/logs?task=publish"}
    base = path[query.split("=")[0]]
    status, doc = con.get(base + ("&" if "?" in base else "?") + query)
    assert status == 400, doc


def _gated(tmp_path: Path) -> tuple[str, str]:
    flow = tmp_path / "gated.py"
    flow.write_text(GATED)
    ledger = str(tmp_path / "ledger.duckdb")
    proc = pipeline_cli("run", f"{flow}:gated", "--store", ledger, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    return ledger, proc.stdout.split()[1]


@pytest.fixture
def gated_run(tmp_path: Path, console_factory: Any) -> tuple[Any, str, str]:
    """A run waiting for an approval and an acting console on it, for one test."""
    ledger, rid = _gated(tmp_path)
    return console_factory(ledger, "--allow-actions"), ledger, rid


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, str]]:
    """The same, shared by the tests that must leave it unchanged."""
    tmp = tmp_path_factory.mktemp("console-inputs")
    ledger, rid = _gated(tmp)
    con = start_console(ledger, tmp / "console.log", "--allow-actions")
    try:
        yield con, ledger, rid
    finally:
        con.stop()
