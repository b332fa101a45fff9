"""``-p KEY=VALUE`` conversion by the pipeline's type hints."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Literal, Optional

import pytest

from ledgerflow import pipeline
from ledgerflow.cli.params import convert_params
from ledgerflow.errors import InputError, ParameterBindError


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


@pipeline
def typed(n: Optional[int] = None, m: int | None = None, ratio: float = 1.0,  # noqa: UP045
          flag: bool = False, path: Path = Path("."), mode: Mode = Mode.FAST,
          kind: Literal["a", "b"] = "a", ids: list[int] | None = None,
          pairs: dict[str, float] | None = None, plain="text", count=3):
    return None


def test_values_follow_the_hints() -> None:
    got = convert_params(typed, ["n=5", "m=6", "ratio=0.5", "flag=yes", "path=/tmp/x",
                                 "mode=slow", "kind=b", "ids=[1, 2]", 'pairs={"x": 1}',
                                 "plain=hello", "count=7"])
    assert got == {"n": 5, "m": 6, "ratio": 0.5, "flag": True, "path": Path("/tmp/x"),
                   "mode": Mode.SLOW, "kind": "b", "ids": [1, 2], "pairs": {"x": 1.0},
                   "plain": "hello", "count": 7}
    assert type(got["n"]) is int and type(got["pairs"]["x"]) is float
    assert convert_params(typed, ["n=none", "mode=FAST"]) == {"n": None, "mode": Mode.FAST}


@pytest.mark.parametrize(("item", "needle"), [
    ("n=five", "must be int | None"), ("flag=maybe", "must be bool"),
    ("mode=medium", "fast, slow"), ("kind=c", "'a', 'b'"), ("ids=[1, \"x\"]", "list[int]"),
    ("ids=3", "a JSON list"), ("count=x", "must be int"),
])
def test_bad_values_name_the_type(item: str, needle: str) -> None:
    with pytest.raises(ParameterBindError, match="must be") as err:
        convert_params(typed, [item])
    assert needle in str(err.value) and err.value.hint.startswith("pass -p ")


def test_unknown_and_malformed_items() -> None:
    with pytest.raises(ParameterBindError, match="has no parameter 'zz'"):
        convert_params(typed, ["zz=1"])
    with pytest.raises(InputError, match="not key=value"):
        convert_params(typed, ["n"])
