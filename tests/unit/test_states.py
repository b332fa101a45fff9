"""The state machines: every pair of states against the tables, creation, resume edges."""

from __future__ import annotations

import itertools

import pytest

from ledgerflow.errors import InvalidTransitionError
from ledgerflow.states import (
    FAILED_LIKE,
    RUN_RESUME_TRANSITIONS,
    RUN_TERMINAL,
    RUN_TRANSITIONS,
    TASK_RESUME_TRANSITIONS,
    TASK_TRANSITIONS,
    TERMINAL,
    RunState,
    TaskState,
    check_restored,
    mermaid,
    run_transition,
    transition,
)

PAIRS = list(itertools.product(TaskState, TaskState))
RUN_PAIRS = list(itertools.product(RunState, RunState))


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a.value}->{b.value}" for a, b in PAIRS])
def test_every_pair_follows_the_table(src: TaskState, dst: TaskState) -> None:
    if dst in TASK_TRANSITIONS[src]:
        assert transition("t", src.value, dst.value) == dst
    else:
        with pytest.raises(InvalidTransitionError, match="cannot go from"):
            transition("t", src.value, dst.value)
    resumable = dst in TASK_TRANSITIONS[src] or dst in TASK_RESUME_TRANSITIONS.get(src, ())
    if resumable:
        assert transition("t", src.value, dst.value, resume=True) == dst
    else:
        with pytest.raises(InvalidTransitionError):
            transition("t", src.value, dst.value, resume=True)


@pytest.mark.parametrize(("src", "dst"), RUN_PAIRS,
                         ids=[f"{a.value}->{b.value}" for a, b in RUN_PAIRS])
def test_every_run_pair_follows_the_tables(src: RunState, dst: RunState) -> None:
    for resume, table in ((False, RUN_TRANSITIONS), (True, RUN_RESUME_TRANSITIONS)):
        if dst in table.get(src, ()):
            assert run_transition("r", src.value, dst.value, resume=resume) == dst
        else:
            with pytest.raises(InvalidTransitionError):
                run_transition("r", src.value, dst.value, resume=resume)


def test_a_crashed_run_can_be_taken_over_but_a_finished_one_cannot() -> None:
    assert run_transition("r", "running", "running", resume=True) == RunState.RUNNING
    with pytest.raises(InvalidTransitionError):
        run_transition("r", "running", "running")
    with pytest.raises(InvalidTransitionError):
        run_transition("r", "succeeded", "running", resume=True)


def test_creation_only_to_the_first_state() -> None:
    assert transition("t", None, "pending") == TaskState.PENDING
    assert run_transition("r", None, "running") == RunState.RUNNING
    for s in TaskState:
        if s != TaskState.PENDING:
            with pytest.raises(InvalidTransitionError):
                transition("t", None, s.value)
    with pytest.raises(InvalidTransitionError):
        run_transition("r", None, "succeeded")


def test_a_restored_state_must_be_known() -> None:
    assert check_restored("t", "retry_wait") == TaskState.RETRY_WAIT
    with pytest.raises(InvalidTransitionError, match="unknown state"):
        check_restored("t", "paused")


def test_every_state_is_a_key_and_terminal_means_no_targets() -> None:
    assert set(TASK_TRANSITIONS) == set(TaskState)
    assert set(RUN_TRANSITIONS) == set(RunState)
    assert TERMINAL == {s for s, t in TASK_TRANSITIONS.items() if not t}
    assert TERMINAL == {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED,
                        TaskState.UPSTREAM_FAILED}
    assert RUN_TERMINAL == {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED}
    assert FAILED_LIKE == TERMINAL - {TaskState.SUCCEEDED}


def test_every_state_reaches_a_terminal_state() -> None:
    for start in TaskState:
        seen, stack = {start}, [start]
        while stack:
            for nxt in TASK_TRANSITIONS[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        assert seen & TERMINAL, start


def test_mermaid_lists_every_edge() -> None:
    text = mermaid()
    for src, targets in TASK_TRANSITIONS.items():
        for dst in targets:
            assert f"{src.value} --> {dst.value}" in text


def test_an_approval_request_is_decided_once() -> None:
    from ledgerflow.states import APPROVAL_TRANSITIONS, ApprovalState, approval_transition

    assert approval_transition("d" * 12, "pending", "expired") is ApprovalState.EXPIRED
    for decided in ("approved", "rejected", "expired"):
        assert not APPROVAL_TRANSITIONS[ApprovalState(decided)]
        with pytest.raises(InvalidTransitionError, match="cannot go from"):
            approval_transition("d" * 12, decided, "approved")
    with pytest.raises(InvalidTransitionError):
        approval_transition("d" * 12, "pending", "maybe")
