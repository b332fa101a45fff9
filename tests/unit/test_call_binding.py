"""A task call's arguments are bound against its signature while tracing (exit 2 before anything runs)."""

from __future__ import annotations

import pytest

from ledgerflow import pipeline, task
from ledgerflow.errors import DefinitionError

RAN: list[str] = []


@task
def double(x: int) -> int:
    RAN.append("double")
    return 2 * x


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def scaled(a: int, *, scale: int = 1) -> int:
    return a * scale


@task
def anything(*args: int, **kwargs: int) -> int:
    return len(args) + len(kwargs)


def _problem(body) -> str:
    with pytest.raises(DefinitionError) as info:
        pipeline(body).build()
    return str(info.value)


def test_missing_argument_is_found_at_trace_time_with_the_call_line() -> None:
    def missing(x: int = 1):
        return add(double(x))
    text = _problem(missing)
    assert "add() missing required argument 'b'" in text
    assert f"{__file__}:" in text and "its signature is add(a, b)" in text
    assert RAN == []                       # the upstream task never ran


@pytest.mark.parametrize("call, expected", [
    (lambda: add(1, 2, 3), "takes 2 positional arguments but 3 were given"),
    (lambda: add(1, a=2), "got multiple values for argument 'a'"),
    (lambda: add(1, c=2), "got an unexpected keyword argument 'c'"),
    (lambda: scaled(1, 2), "takes 1 positional arguments but 2 were given"),
    (lambda: scaled(), "missing required argument 'a'"),
    (lambda: add.map([1, 2]), "add.map() calls add(item, ...), which missing"),
    (lambda: scaled.map([1], size=2), "unexpected keyword argument 'size'"),
])
def test_each_kind_of_bad_call_is_named(call, expected) -> None:
    def body():
        return call()
    assert expected in _problem(body)


def test_good_calls_trace() -> None:
    def body(x: int = 1):
        y = scaled(double(x), scale=3)
        return add(y, b=2), scaled.map([1, 2], scale=2), anything(1, 2, k=3), add(a=1, b=2)
    assert len(pipeline(body).build()) == 6
