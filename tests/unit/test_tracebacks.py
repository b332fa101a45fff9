"""A recorded traceback starts at the task author's own code, not in the executor."""

from __future__ import annotations

import pytest

from ledgerflow import pipeline, task
from ledgerflow.tracebacks import user_traceback


def _inner() -> None:
    raise ValueError("bad value")


@task(retries=0)
def broken(x: int) -> int:
    _inner()
    return x


@pipeline
def one():
    return broken(1)


def test_a_user_error_starts_at_the_task() -> None:
    try:
        broken.fn(1)
    except ValueError as exc:
        text = user_traceback(exc)
    assert text.startswith("Traceback (most recent call last):")
    assert "in broken" in text and "in _inner" in text and "ValueError: bad value" in text


def test_framework_frames_above_the_task_are_dropped(tmp_path) -> None:
    run = one.run(store=str(tmp_path / "l.duckdb"), executor="inline")
    (attempt,) = run.attempts("broken")
    tb = attempt["traceback"]
    first_frame = tb.splitlines()[1]
    assert __file__ in first_frame and "in broken" in first_frame, tb
    assert "ledgerflow/executor.py" not in tb and "ledgerflow_executors" not in tb
    assert tb.rstrip().endswith("ValueError: bad value")


def test_an_error_of_the_framework_itself_keeps_every_frame() -> None:
    from ledgerflow.errors import InputError
    with pytest.raises(InputError) as info:
        from ledgerflow.specs.document import read_document
        read_document("/nonexistent/spec.toml")
    text = user_traceback(info.value)
    assert "ledgerflow" in text and "Traceback" in text
