"""The approval-gate integration tests (tests/integration/test_approvals.py) on the
postgres store: the same tests, with the ledger a database on the session's server.

Decisions are ``signals`` rows (the first decider of a request wins) plus a NOTIFY;
a waiting driver hears of them from its keeper (NOTIFY, and a poll every second).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
