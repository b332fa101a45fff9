"""The approval-gate integration tests (tests/integration/test_approvals.py) on the
postgres store: the same tests, with the ledger a database on the session's server.

Decisions are ``signals`` rows (the first decider of a request wins) plus a NOTIFY;
a waiting driver hears of them from its keeper (NOTIFY, and a poll every second).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ledgerflow
from ledgerflow import pipeline, task
from ledgerflow_postgres import lease
from tests.integration.test_approvals import (
    FLOW,
    test_a_killed_waiting_driver_approval_from_elsewhere_resume,
    test_approve_and_reject_racing_exactly_one_wins,
    test_reject_fails_the_task_and_its_downstream,
    test_wait_approvals_picks_up_a_decision,
    test_waiting_approve_with_the_digest_resume_succeeds,
)

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess]

__all__ = [
    "test_a_killed_waiting_driver_approval_from_elsewhere_resume",
    "test_approve_and_reject_racing_exactly_one_wins",
    "test_reject_fails_the_task_and_its_downstream",
    "test_wait_approvals_picks_up_a_decision",
    "test_waiting_approve_with_the_digest_resume_succeeds",
]


@pytest.fixture
def project(tmp_path: Path, pg_url: str) -> tuple[Path, str, dict[str, str]]:
    """The approval tests' project, its ledger in PostgreSQL."""
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env["SIDE"] = str(tmp_path / "side.log")
    env["LEDGERFLOW_BLOB_DIR"] = str(tmp_path / "blobs")
    return flow, pg_url, env



@task(approve=True)
def publish(text: str) -> str:
    return f"sent {text}"


@pipeline
def gated(text: str = "hello"):
    return publish(text)


def test_a_resume_sees_a_decision_before_its_keeper_first_polls(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decision made while no driver held the run is read from the table by the resume,
    even when its lease keeper has not read the signals yet (on a loaded machine the
    keeper's thread starts late; the resume used to find no decision and stay waiting)."""
    run = gated.run(store=pg_url, executor="inline")
    assert run.state == "waiting"
    (req,) = run.approvals(pending_only=True)
    run.approve("publish", digest=req["digest"], by="reviewer", reason="fine")
    monkeypatch.setattr(lease.Keeper, "_poll", lambda self: None)   # the keeper never reads
    done = ledgerflow.resume(run.run_id, store=pg_url, executor="inline")
    assert done.state == "succeeded" and done.result() == "sent hello"
