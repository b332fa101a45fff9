from __future__ import annotations

import itertools

import pytest

from ledgerflow.errors import InvalidTransitionError
from ledgerflow.states import (
    RESETTABLE,
    TASK_TRANSITIONS,
    TERMINAL,
    TaskState,
    mermaid,
    reset_for_resume,
    transition,
)

PAIRS = list(itertools.product(TaskState, TaskState))


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a.value}->{b.value}" for a, b in PAIRS])
def test_every_pair_follows_the_table(src: TaskState, dst: TaskState) -> None:
    if dst in TASK_TRANSITIONS[src]:
        assert transition("t", src.value, dst.value) == dst.value
    else:
        with pytest.raises(InvalidTransitionError, match="cannot go from"):
            transition("t", src.value, dst.value)


def test_every_state_is_a_key_and_terminal_means_no_targets() -> None:
    assert set(TASK_TRANSITIONS) == set(TaskState)
    assert TERMINAL == {s for s, t in TASK_TRANSITIONS.items() if not t}
    assert TERMINAL == {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED,
                        TaskState.UPSTREAM_FAILED}


def test_every_state_reaches_a_terminal_state() -> None:
    for start in TaskState:
        seen, stack = {start}, [start]
        while stack:
            for nxt in TASK_TRANSITIONS[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        assert seen & TERMINAL, start


def test_resume_resets_only_failed_like_states() -> None:
    for s in TaskState:
        if s in RESETTABLE:
            assert reset_for_resume("t", s.value) == "pending"
        else:
            with pytest.raises(InvalidTransitionError):
                reset_for_resume("t", s.value)


def test_mermaid_lists_every_edge() -> None:
    text = mermaid()
    for src, targets in TASK_TRANSITIONS.items():
        for dst in targets:
            assert f"{src.value} --> {dst.value}" in text
