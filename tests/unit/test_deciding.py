"""Who may decide a gate that lists approvers: approving and rejecting alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerflow import Approval, pipeline, task
from ledgerflow.errors import InputError


@task(approve=Approval(approvers=["alice"]))
def publish(text: str) -> str:
    return f"sent {text}"


@pipeline
def gated(text: str = "hello"):
    return publish(text)


def test_a_person_the_gate_does_not_list_can_neither_approve_nor_reject(
        tmp_path: Path) -> None:
    store = str(tmp_path / "l.duckdb")
    run = gated.run(store=store, executor="inline")
    assert run.state == "waiting"
    (req,) = run.approvals(pending_only=True)
    with pytest.raises(InputError, match="'bob' may not approve 'publish'; its approvers "
                       "are: alice"):
        run.approve("publish", digest=req["digest"], by="bob")
    with pytest.raises(InputError, match="'bob' may not reject 'publish'"):
        run.reject("publish", reason="no", by="bob")     # a reject stops it: also a decision
    (still,) = run.approvals(pending_only=True)
    assert still["state"] == "pending"
    run.reject("publish", reason="not now", by="alice")
    assert [a["decided_by"] for a in run.approvals()] == ["alice"]
