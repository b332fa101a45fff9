"""Asking a run for a task it does not have names the closest keys."""

from __future__ import annotations

import pytest

from ledgerflow import pipeline, task
from ledgerflow.errors import TaskNotFoundError


@task
def square(x: int) -> int:
    return x * x


@pipeline
def squares():
    return square.map([1, 2, 3])


def test_a_typo_gets_the_closest_keys_as_a_hint(tmp_path) -> None:
    run = squares.run(store=str(tmp_path / "l.duckdb"), executor="inline")
    with pytest.raises(TaskNotFoundError) as info:
        run.result("sqare[2]")
    assert str(info.value) == f"run {run.run_id} has no task 'sqare[2]'"
    assert info.value.hint.startswith("did you mean 'square[2]'")
    assert info.value.exit_code == 2


def test_no_close_key_hints_the_listing(tmp_path) -> None:
    run = squares.run(store=str(tmp_path / "l.duckdb"), executor="inline")
    with pytest.raises(TaskNotFoundError) as info:
        run.result("publish")
    assert info.value.hint == f"list its tasks with: pipeline status {run.run_id}"


def test_equally_close_keys_come_in_their_natural_order() -> None:
    keys = [f"square[{i}]" for i in range(12)]
    hint = TaskNotFoundError("r", "squar", keys).hint
    assert hint == "did you mean 'square[0]' or 'square[1]' or 'square[2]'?"
