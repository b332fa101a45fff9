"""Type hints of task signatures: as JSON Schema, as text, and whether a value or type fits.

A declarative spec gives a task's arguments as JSON/TOML literals (``args``)
or feeds them from other steps (``inputs``, ``map``). This module answers the
three questions the spec checker and the spec's JSON Schema need, from the
annotations alone (nothing is called):

* :func:`to_schema` -- the JSON Schema of the literals a hint accepts
  (``None`` when no literal can be one, e.g. ``pyarrow.Table``: such an
  argument must come from a step);
* :func:`value_fits` -- does this literal fit the hint;
* :func:`type_fits` -- can a step returning ``produced`` feed a parameter of
  type ``expected``. It answers ``False`` only when *no* value of the produced
  type could fit (an unannotated or ``Any`` side always fits), so a report is
  never a guess.

Hints that cannot be resolved (a name imported only under ``TYPE_CHECKING``)
count as ``Any``.
"""

from __future__ import annotations

import collections.abc as cabc
import enum
import inspect
import json
import os
import pathlib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, Union, get_args, get_origin

#: What an unannotated or unresolvable parameter counts as.
ANY: Final = Any

_NoneType = type(None)
_SCALARS: Final = {str: "string", int: "integer", float: "number", bool: "boolean",
                   _NoneType: "null"}
_PATHS: Final = (pathlib.PurePath, os.PathLike)


def hints_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of ``fn`` (``return`` included); unresolvable ones are Any."""
    try:
        return dict(typing.get_type_hints(fn))
    except Exception:       # one bad name must not lose the others: resolve one by one
        pass
    raw = dict(getattr(fn, "__annotations__", {}) or {})
    module = inspect.getmodule(fn)
    space = dict(vars(module)) if module is not None else {}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if isinstance(value, str):
            try:
                value = eval(value, space)  # an annotation of the user's own code
            except Exception:
                value = ANY
        out[name] = value
    return out


def _is_union(hint: Any) -> bool:
    origin = get_origin(hint)
    return origin is Union or origin is types.UnionType


def _members(hint: Any) -> tuple[Any, ...]:
    return get_args(hint) if _is_union(hint) else (hint,)


def _is_any(hint: Any) -> bool:
    return hint is Any or hint is object or hint is inspect.Parameter.empty \
        or isinstance(hint, typing.TypeVar)


def _strip(hint: Any) -> Any:
    """``Annotated[X, ...]`` -> X; ``NewType`` -> its base."""
    while True:
        if get_origin(hint) is typing.Annotated:
            hint = get_args(hint)[0]
        elif hasattr(hint, "__supertype__"):
            hint = hint.__supertype__
        else:
            return hint


def _is_typeddict(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, dict) and hasattr(hint, "__total__")


def _sequence_item(hint: Any) -> tuple[bool, Any]:
    """``(True, item type)`` if ``hint`` is a homogeneous sequence type (list[X], ...)."""
    origin = get_origin(hint) or hint
    args = get_args(hint)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return True, args[0]
        return False, None
    if origin in (list, set, frozenset) or (isinstance(origin, type) and origin is not str
                                            and origin is not bytes
                                            and issubclass(origin, (cabc.Sequence, cabc.Set))
                                            and not issubclass(origin, cabc.Mapping)):
        return True, args[0] if args else ANY
    if origin in (cabc.Iterable, cabc.Collection, cabc.Iterator):
        return True, args[0] if args else ANY
    return False, None


def _mapping_types(hint: Any) -> tuple[bool, Any, Any]:
    origin = get_origin(hint) or hint
    if _is_typeddict(hint):
        return True, str, ANY
    if origin is dict or (isinstance(origin, type) and issubclass(origin, cabc.Mapping)):
        args = get_args(hint)
        return True, (args[0] if args else ANY), (args[1] if len(args) > 1 else ANY)
    return False, None, None


def describe(hint: Any) -> str:
    """A short readable form of a hint: ``list[dict[str, str]]``, ``int | None``."""
    hint = _strip(hint)
    if _is_any(hint):
        return "Any"
    if hint is _NoneType or hint is None:
        return "None"
    if _is_union(hint):
        return " | ".join(describe(m) for m in get_args(hint))
    origin = get_origin(hint)
    if origin is Literal:
        return "Literal[" + ", ".join(repr(a) for a in get_args(hint)) + "]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        args = get_args(hint)
        inner = ", ".join("..." if a is Ellipsis else describe(a) for a in args)
        return f"{name}[{inner}]" if args else name
    if isinstance(hint, type):
        mod = hint.__module__
        return hint.__qualname__ if mod in ("builtins", "typing") else f"{mod}.{hint.__qualname__}"
    return str(hint)


def to_schema(hint: Any) -> dict[str, Any] | None:
    """The JSON Schema of the literals ``hint`` accepts, or None when none can fit.

    Example:
        >>> to_schema(list[int])
        {'type': 'array', 'items': {'type': 'integer'}}
        >>> to_schema(int | None)
        {'anyOf': [{'type': 'integer'}, {'type': 'null'}]}
    """
    hint = _strip(hint)
    if _is_any(hint):
        return {}
    if hint is None:
        hint = _NoneType
    if _is_union(hint):
        parts = [s for s in (to_schema(m) for m in get_args(hint)) if s is not None]
        if not parts:
            return None
        if any(p == {} for p in parts):
            return {}
        return parts[0] if len(parts) == 1 else {"anyOf": parts}
    origin = get_origin(hint)
    if origin is Literal:
        values = [v.value if isinstance(v, enum.Enum) else v for v in get_args(hint)]
        return {"enum": values}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    if isinstance(hint, type) and issubclass(hint, _PATHS):
        return {"type": "string"}
    if _is_typeddict(hint):
        th = hints_of(hint)
        props = {k: s for k, v in th.items() if (s := to_schema(v)) is not None}
        required = sorted(getattr(hint, "__required_keys__", ()))
        out: dict[str, Any] = {"type": "object", "properties": props}
        if required:
            out["required"] = required
        return out
    if origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item = to_schema(args[0])
            return None if item is None else {"type": "array", "items": item}
        if args == ((),):
            return {"type": "array", "maxItems": 0}
        items = [to_schema(a) for a in args]
        if any(i is None for i in items):
            return None
        return {"type": "array", "prefixItems": items, "minItems": len(items),
                "maxItems": len(items)}
    is_seq, item = _sequence_item(hint)
    if is_seq:
        sub = to_schema(item)
        if sub is None:
            return None
        return {"type": "array", "items": sub} if sub else {"type": "array"}
    is_map, key, value = _mapping_types(hint)
    if is_map:
        if not (_is_any(key) or key is str):
            return None             # JSON and TOML keys are strings
        sub = to_schema(value)
        if sub is None:
            return None
        return {"type": "object", "additionalProperties": sub} if sub else {"type": "object"}
    return None


def json_kind(value: object) -> str:
    """The JSON name of a literal's type: string, integer, number, boolean, array, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__


def value_fits(value: object, hint: Any) -> bool:
    """True if the JSON/TOML literal ``value`` is a valid argument of type ``hint``.

    Example:
        >>> value_fits([1, 2], list[int]), value_fits("3", int), value_fits(3, float)
        (True, False, True)
    """
    hint = _strip(hint)
    if _is_any(hint):
        return True
    if hint is None or hint is _NoneType:
        return value is None
    if _is_union(hint):
        return any(value_fits(value, m) for m in get_args(hint))
    origin = get_origin(hint)
    if origin is Literal:
        allowed = [v.value if isinstance(v, enum.Enum) else v for v in get_args(hint)]
        return any(value == a and type(value) is type(a) for a in allowed)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return any(value == m.value for m in hint)
    if isinstance(hint, type) and issubclass(hint, _PATHS):
        return isinstance(value, str)
    if _is_typeddict(hint):
        if not isinstance(value, dict):
            return False
        th = hints_of(hint)
        required: frozenset[str] = getattr(hint, "__required_keys__", frozenset())
        return all(k in value for k in required) and all(
            value_fits(v, th.get(k, ANY)) for k, v in value.items())
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return all(value_fits(v, args[0]) for v in value)
        if args == ((),):
            return len(value) == 0
        return len(value) == len(args) and all(value_fits(v, a) for v, a in zip(value, args, strict=True))
    is_seq, item = _sequence_item(hint)
    if is_seq:
        return isinstance(value, (list, tuple)) and all(value_fits(v, item) for v in value)
    is_map, key, val = _mapping_types(hint)
    if is_map:
        return isinstance(value, dict) and all(
            value_fits(k, key) and value_fits(v, val) for k, v in value.items())
    return False        # a class no literal can be (pyarrow.Table, a dataclass...)


def element_type(hint: Any) -> tuple[bool, Any]:
    """``(True, X)`` when a value of ``hint`` is a list of X (a fan-out can map over it);
    ``(True, Any)`` when unknown; ``(False, None)`` when it is certainly not a list."""
    hint = _strip(hint)
    if _is_any(hint):
        return True, ANY
    if _is_union(hint):
        found = [element_type(m) for m in get_args(hint) if m is not _NoneType]
        items = [t for ok, t in found if ok]
        if not items:
            return False, None
        return True, items[0] if len(items) == 1 else Union[tuple(items)]  # noqa: UP007
    is_seq, item = _sequence_item(hint)
    if is_seq:
        return True, item
    return False, None


def type_fits(produced: Any, expected: Any) -> bool:
    """False only when no value of type ``produced`` can be a valid ``expected``.

    Example:
        >>> type_fits(list[dict[str, str]], dict[str, str])
        False
        >>> type_fits(int, float), type_fits(dict[str, int], dict)
        (True, True)
    """
    produced, expected = _strip(produced), _strip(expected)
    if _is_any(produced) or _is_any(expected):
        return True
    if produced is None:
        produced = _NoneType
    if expected is None:
        expected = _NoneType
    if _is_union(produced):
        return any(type_fits(m, expected) for m in get_args(produced))
    if _is_union(expected):
        return any(type_fits(produced, m) for m in get_args(expected))
    p_origin, e_origin = get_origin(produced), get_origin(expected)
    if p_origin is Literal:
        return any(value_fits(v, expected) or type_fits(type(v), expected)
                   for v in get_args(produced))
    if e_origin is Literal:
        return any(type_fits(produced, type(v)) for v in get_args(expected))
    if expected is float and produced in (int, float):
        return True
    if isinstance(expected, type) and issubclass(expected, _PATHS) and produced is str:
        return True
    p_seq, p_item = _sequence_item(produced)
    e_seq, e_item = _sequence_item(expected)
    if p_seq or e_seq:
        if not (p_seq and e_seq):
            return _class_fits(produced, expected)
        if not _class_fits(produced, expected):
            return False
        return type_fits(p_item, e_item)
    p_map, p_key, p_val = _mapping_types(produced)
    e_map, e_key, e_val = _mapping_types(expected)
    if p_map or e_map:
        if not (p_map and e_map):
            return False
        return type_fits(p_key, e_key) and type_fits(p_val, e_val)
    return _class_fits(produced, expected)


def _class_fits(produced: Any, expected: Any) -> bool:
    p = get_origin(produced) or produced
    e = get_origin(expected) or expected
    if not (isinstance(p, type) and isinstance(e, type)):
        return True         # something we cannot judge (a Protocol alias, a string...)
    try:        # some value of p can be an e: one class contains the other
        return issubclass(p, e) or issubclass(e, p) or (e is float and p is int)
    except TypeError:
        return True


def show(value: object) -> str:
    """A literal as short JSON text (for messages)."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def example(schema: Mapping[str, Any]) -> str:
    """A short description with an example literal of a JSON Schema (for hints)."""
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"][:6])
    if "anyOf" in schema:
        return " or ".join(example(s) for s in schema["anyOf"][:3])
    kind = schema.get("type")
    if kind == "array":
        return "a list, e.g. [" + example(schema.get("items", {})).split("e.g. ")[-1] + ", ...]"
    return {"string": 'a string, e.g. "text"', "integer": "an integer, e.g. 10",
            "number": "a number, e.g. 1.5", "boolean": "true or false",
            "null": "nothing (leave it out)", "object": "a table, e.g. { key = 1 }"}.get(
        kind if isinstance(kind, str) else "", "any value")
