"""``-p KEY=VALUE``: pipeline parameters converted by the pipeline's type hints.

Hints come from :func:`typing.get_type_hints`, so string annotations
(``from __future__ import annotations``) work like real ones. Supported:
``str``, ``int``, ``float``, ``bool``, ``pathlib.Path``, enums (by value or
name), ``Literal[...]``, ``X | None`` / ``Optional[X]`` (``none``/``null``
give None), and ``list``/``dict``/``tuple`` (JSON, items converted by their
own hints, e.g. ``list[int]``). Unannotated parameters take the type of
their default, else stay text.
"""

from __future__ import annotations

import enum
import inspect
import json
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError, ParameterBindError
from ..pipeline import Pipeline

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def convert_params(pipe: Pipeline[..., Any], raw: Sequence[str]) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` items into the pipeline's parameters."""
    params = pipe.signature.parameters
    try:
        hints = typing.get_type_hints(pipe.fn)
    except Exception:        # an annotation that does not resolve: fall back to text
        hints = {}
    out: dict[str, Any] = {}
    for item in raw:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise InputError(f"parameter {item!r} is not key=value",
                             hint="pass parameters as -p name=value")
        if key not in params:
            raise ParameterBindError(
                f"pipeline {pipe.name!r} has no parameter {key!r}; it takes: "
                + (", ".join(params) or "no parameters"),
                hint=f"pass one of: {', '.join(params)}" if params else "drop the -p options")
        param = params[key]
        hint = hints.get(key, inspect.Parameter.empty)
        if hint is inspect.Parameter.empty:
            hint = type(param.default) if param.default not in (
                inspect.Parameter.empty, None) else str
        try:
            out[key] = parse(hint, text)
        except (ValueError, TypeError) as exc:
            name = type_name(hint)
            raise ParameterBindError(
                f"parameter {key!r} of {pipe.name!r} must be {name}, given: {text!r}"
                + (f" ({exc})" if str(exc) and str(exc) != text else ""),
                hint=f"pass -p {key}=<{name}>") from None
    return out


def _is_union(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union


def type_name(hint: Any) -> str:
    """A readable name of a type hint (``int | None``, ``list[int]``)."""
    if hint is type(None):
        return "None"
    if _is_union(hint):
        return " | ".join(type_name(a) for a in typing.get_args(hint))
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def parse(hint: Any, text: str) -> Any:
    """``text`` as a value of type ``hint`` (raises ValueError when it is not one)."""
    if hint is Any or hint is object:
        return text
    if _is_union(hint):
        args = typing.get_args(hint)
        if type(None) in args and text.lower() in ("none", "null", ""):
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return parse(arg, text)
            except (ValueError, TypeError) as exc:
                errors.append(str(exc))
        raise ValueError(errors[0] if len(errors) == 1 else text)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        for choice in typing.get_args(hint):
            if str(choice) == text:
                return choice
        raise ValueError("one of " + ", ".join(repr(c) for c in typing.get_args(hint)))
    if origin in (list, tuple, dict, set, frozenset) or hint in (list, tuple, dict):
        return _container(hint, origin or hint, json.loads(text))
    return _scalar(hint, text)


def _scalar(hint: Any, value: Any) -> Any:
    text = value if isinstance(value, str) else json.dumps(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(text)
    if hint is int:
        if isinstance(value, bool):
            raise ValueError(text)
        return int(value) if isinstance(value, int) else int(text)
    if hint is float:
        return float(value) if isinstance(value, (int, float)) else float(text)
    if hint is str:
        return value if isinstance(value, str) else text
    if hint is Path or (isinstance(hint, type) and issubclass(hint, Path)):
        return hint(text)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        for member in hint:
            if str(member.value) == text or member.name == text:
                return member
        raise ValueError("one of " + ", ".join(str(m.value) for m in hint))
    return value


def _container(hint: Any, origin: Any, value: Any) -> Any:
    args = typing.get_args(hint)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError("a JSON object")
        if len(args) == 2:
            return {k: _item(args[1], v) for k, v in value.items()}
        return value
    if not isinstance(value, list):
        raise ValueError("a JSON list")
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_item(args[0], v) for v in value)
        if args:
            if len(args) != len(value):
                raise ValueError(f"{len(args)} items")
            return tuple(_item(a, v) for a, v in zip(args, value, strict=True))
        return tuple(value)
    items = [_item(args[0], v) for v in value] if args else value
    return origin(items) if origin in (set, frozenset) else items


def _item(hint: Any, value: Any) -> Any:
    if _is_union(hint) or typing.get_origin(hint) is typing.Literal:
        return value if value is None else parse(hint, value if isinstance(value, str)
                                                 else json.dumps(value))
    origin = typing.get_origin(hint)
    if origin in (list, tuple, dict, set, frozenset):
        return _container(hint, origin, value)
    return _scalar(hint, value)
