"""The README's *Approval gates* path: its example, then ``pipeline approvals`` and
``pipeline approve ... --resume`` with the digest read from ``pipeline approvals --json``."""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerflow

from . import cli
from .readme import blocks, section

pytestmark = pytest.mark.subprocess


def test_a_task_gate_then_an_in_task_gate_each_approved_by_digest(tmp_path: Path) -> None:
    (python,) = blocks("Approval gates", "python")
    (tmp_path / "flows.py").write_text(python)
    text = section("Approval gates")
    approvals = cli.usage(text, "approvals")               # pipeline approvals RUN_ID
    approve = cli.usage(text, "approve")                   # ... --digest PREFIX --as NAME --resume
    assert approve[-1] == "--resume"

    ran = cli.run(["pipeline", "run", "flows.py"], tmp_path)
    assert ran.returncode == 3, ran.stdout + ran.stderr    # waiting, and says how to decide
    run_id = cli.run_id(ran.stdout.splitlines()[0])
    assert f"pipeline approve {run_id} 'publish' --digest" in ran.stdout

    # the task gate: before publish's first attempt, showing its arguments
    (req,) = cli.json_of(approvals, tmp_path, RUN_ID=run_id)
    assert (req["task_key"], req["approvers"]) == ("publish", ["ana"])
    assert req["summary"] == 'values=[1, 2, 3], target="ops"'
    listed = cli.run(approvals, tmp_path, RUN_ID=run_id)
    assert listed.returncode == 0 and req["digest"][:12] in listed.stdout

    # only a named approver may decide
    stranger = cli.run(approve, tmp_path, RUN_ID=run_id, TASK="publish",
                       PREFIX=req["digest"][:12], NAME="bob")
    assert stranger.returncode == 2 and "ana" in stranger.stderr, stranger.stderr
    first = cli.run(approve, tmp_path, RUN_ID=run_id, TASK="publish",
                    PREFIX=req["digest"][:12], NAME="ana")
    assert first.returncode == 3, first.stdout + first.stderr   # now notify's own gate waits

    # the in-task gate: its payload is the composed text, and nothing was sent yet
    (req,) = cli.json_of(approvals, tmp_path, RUN_ID=run_id)
    assert (req["task_key"], req["action"]) == ("notify", "send")
    assert "3 values published" in req["summary"]
    assert cli.json_of(["pipeline", "logs", run_id, "--task", "notify"], tmp_path) == []
    done = cli.run(approve, tmp_path, RUN_ID=run_id, TASK="notify",
                   PREFIX=req["digest"][:12], NAME="ana")
    assert done.returncode == 0, done.stdout + done.stderr

    status = cli.json_of(["pipeline", "status", run_id], tmp_path)
    assert status["state"] == "succeeded"
    assert {t["key"]: t["attempts"] for t in status["tasks"]} == {"publish": 1, "notify": 2}
    logs = cli.json_of(["pipeline", "logs", run_id, "--task", "notify"], tmp_path)
    assert [(line["attempt"], line["text"]) for line in logs] == [
        (2, "sent: 3 values published\n")]                 # sent once, after the approval
    run = ledgerflow.get_run(run_id, store=str(tmp_path / ".ledgerflow" / "ledger.duckdb"))
    assert run.result() == "3 values published"
    assert cli.json_of(approvals, tmp_path, RUN_ID=run_id) == []
