"""Typed outputs: an agent task's final answer checked against its ``output=`` type.

``@agent_task(..., output=Answer)`` takes any type msgspec can decode JSON
into: a dataclass, a ``TypedDict``, a ``msgspec.Struct``, a ``list[...]``, or a
plain ``int`` / ``float`` / ``bool``. The system prompt asks for JSON matching
the type's schema; the final answer (a fenced ```json block is unwrapped) is
decoded and checked, and the task returns the typed value. A mismatch goes
back to the model as an error it can correct (see ``corrections=``).
``output=str`` (or none) keeps the text as it is.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from ledgerflow.errors import DefinitionError

__all__ = ["OutputMismatch", "output_schema", "parse_output"]

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


class OutputMismatch(ValueError):
    """The final answer is not JSON of the task's output type (the text says why)."""


def output_schema(kind: Any) -> str:
    """The JSON schema of ``kind`` as compact text; DefinitionError if msgspec cannot use it."""
    try:
        return json.dumps(msgspec.json.schema(kind), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise DefinitionError(f"output={kind!r} is not a type an answer can be checked "
                              f"against: {exc}",
                              hint="use a dataclass, TypedDict, msgspec.Struct or a plain "
                                   "type such as int") from exc


def parse_output(text: str, kind: Any) -> Any:
    """``text`` decoded as a ``kind`` value; OutputMismatch saying what is wrong."""
    if kind is None or kind is str:
        return text
    m = _FENCE.match(text)
    body = (m.group(1) if m else text).strip()
    try:
        return msgspec.json.decode(body.encode(), type=kind)
    except msgspec.ValidationError as exc:
        raise OutputMismatch(f"does not match the output type: {exc}") from None
    except msgspec.DecodeError:
        raise OutputMismatch(f"is not JSON: {body[:120]!r}") from None
