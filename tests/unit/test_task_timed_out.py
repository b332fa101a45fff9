"""A task that raises ``TaskTimedOut`` ends its attempt as ``timeout``, retried by policy."""

from __future__ import annotations

import pytest

from ledgerflow import TaskTimedOut, context, pipeline, task
from ledgerflow.executor import Job, execute


@task(retries=1)
def gives_up_once() -> str:
    if context().attempt == 1:
        raise TaskTimedOut("took longer than its own 1s limit")
    return "second attempt"


@task(retries=1)
def always_late() -> None:
    raise TaskTimedOut("over its limit")


def test_execute_maps_task_timed_out_to_a_timeout_completion() -> None:
    c = execute(Job(id=1, run_id="r", task_key="k", attempt=1, fn=always_late, args=(),
                    kwargs={}))
    assert c.outcome == "timeout"
    assert c.error is None and c.error_type == "TaskTimedOut"
    assert c.error_message == "over its limit"


@pytest.mark.parametrize("executor", ["inline", "threads", "processes"])
def test_a_timed_out_attempt_is_retried_then_the_task_fails(ledger: str, executor: str) -> None:
    @pipeline
    def p():
        return gives_up_once(), always_late()

    run = p.run(store=ledger, executor=executor)
    tasks = run.status().tasks
    assert tasks["gives_up_once"].state == "succeeded"
    assert [a["outcome"] for a in run.attempts("gives_up_once")] == ["timeout", "ok"]
    assert tasks["always_late"].state == "failed"
    assert [a["outcome"] for a in run.attempts("always_late")] == ["timeout", "timeout"]
    assert "over its limit" in (tasks["always_late"].error or "")
