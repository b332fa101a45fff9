"""Edited arguments of an approval: what a gate lets an approver edit, the check, how reads show it.

An in-task gate may let its approver change the ``arguments`` of its payload
(``context().approval(action, payload, edit={"schema": ..., "ref": ...})``; the
agents plugin does for a tool call: the tool's JSON schema, and the call's
arguments digest as ``ref``). The request keeps that under ``inputs["edit"]``.
An approver may then approve with other arguments (``approve(...,
arguments={...})``): they are checked against the schema before anything is
written (a wrong name or type is an InputError, the ledger untouched), the
decision records them (its ``arguments``) and applies to the request's digest
only. A request that declared nothing (a task gate, an in-task gate without
``edit=``) refuses an edit.

Readers see an edit as ``edit``: ``{"approval", "by", "original", "arguments"}``
(``original``: the request's arguments as it showed them, secrets masked) on the
approvals rows (:func:`approvals_with_edits`) and on the tool calls it is
``ref`` of (:func:`calls_with_edits`).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from .approval import EDIT, masked
from .errors import InputError

_TYPES: Final = {"string": (str,), "integer": (int,), "number": (int, float),
                 "boolean": (bool,), "array": (list,), "object": (dict,),
                 "null": (type(None),)}


def spec_of(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a request row lets an approver edit (``{"schema", "ref"}``), None if nothing
    (a row of :func:`ledgerflow.gates.pending` has it as ``edit_spec``)."""
    if "edit_spec" in row:
        return row["edit_spec"]     # type: ignore[no-any-return]
    raw = (row.get("inputs") or {}).get(EDIT)
    try:
        spec = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    return spec if isinstance(spec, dict) and isinstance(spec.get("schema"), dict) else None


def checked(req: Mapping[str, Any], arguments: object) -> dict[str, Any]:
    """The edited ``arguments`` for the request row ``req``, as its decision records them.

    Raises:
        InputError: the request lets nothing be edited, or the arguments do not fit
            its schema (an unknown or missing name, a wrong type).
    """
    spec = spec_of(req)
    what = f"{req['task_key']!r} ({req['action']})"
    if spec is None:
        raise InputError(f"the request of {what} is not a tool call: its arguments cannot "
                         "be edited", hint="approve it as asked (without --arguments), or "
                         "reject it with --reason")
    schema = spec["schema"]
    why = problem(schema, arguments) if isinstance(arguments, Mapping) \
        else f"the arguments must be a JSON object, given {_shown(arguments)}"
    if why or not isinstance(arguments, Mapping):
        raise InputError(f"the edited arguments for {what} do not fit: {why}",
                         hint=f"pass the arguments it takes: {takes(schema)} (nothing "
                         "was recorded)")
    return dict(arguments)


def takes(schema: Mapping[str, Any]) -> str:
    """The arguments an object schema takes, one-line (``a: integer, b?: string``)."""
    req = set(schema.get("required") or ())
    parts = [f"{n}{'' if n in req else '?'}: {_kind(s)}"
             for n, s in (schema.get("properties") or {}).items()]
    return "{" + ", ".join(parts) + "}"


def _kind(schema: Mapping[str, Any]) -> str:
    if "anyOf" in schema:
        return " | ".join(_kind(s) for s in schema["anyOf"])
    if "enum" in schema:
        return "one of " + json.dumps(schema["enum"])
    t = schema.get("type", "any")
    return "|".join(t) if isinstance(t, list) else str(t)


def problem(schema: Mapping[str, Any], value: object, where: str = "") -> str:
    """Why ``value`` does not fit the JSON ``schema`` ("" if it does). The subset tool
    schemas use: type, enum, anyOf, properties, required, additionalProperties, items,
    bounds; other keywords are left to the tool's own check when it runs."""
    name = where or "the arguments"
    if "anyOf" in schema:
        whys = [problem(s, value, where) for s in schema["anyOf"]]
        return "" if "" in whys else whys[0]
    if "enum" in schema and value not in schema["enum"]:
        return f"{name} must be one of {json.dumps(schema['enum'])}, given {_shown(value)}"
    types = schema.get("type")
    if types is not None:
        allowed = types if isinstance(types, list) else [types]
        if not any(_is(value, t) for t in allowed):
            return f"{name} must be {' or '.join(allowed)}, given {_shown(value)}"
    if isinstance(value, dict):
        return _object(schema, value, where)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            why = problem(schema["items"], item, f"{name}[{i}]")
            if why:
                return why
    return _bounds(schema, value, name)


def _object(schema: Mapping[str, Any], value: dict[str, Any], where: str) -> str:
    props = schema.get("properties")
    extra = schema.get("additionalProperties", True)
    if props is not None and extra is False:
        unknown = sorted(set(value) - set(props))
        if unknown:
            return (f"unknown argument(s) {', '.join(unknown)} (it takes "
                    f"{', '.join(props) or 'none'})")
    missing = [n for n in schema.get("required") or () if n not in value]
    if missing:
        return f"missing argument(s) {', '.join(missing)}"
    for key, item in value.items():
        sub = (props or {}).get(key, extra if isinstance(extra, dict) else None)
        if isinstance(sub, dict):
            why = problem(sub, item, f"{where}.{key}" if where else key)
            if why:
                return why
    return ""


def _bounds(schema: Mapping[str, Any], value: object, name: str) -> str:
    checks: list[tuple[str, Callable[[Any, Any], bool]]] = [
        ("minimum", operator.ge), ("maximum", operator.le),
        ("exclusiveMinimum", operator.gt), ("exclusiveMaximum", operator.lt)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, ok in checks:
            if key in schema and not ok(value, schema[key]):
                return f"{name} must satisfy {key} {schema[key]}, given {_shown(value)}"
    if isinstance(value, (str, list)):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{name} must have at least {schema['minLength']} character(s)"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{name} must have at most {schema['maxLength']} character(s)"
    return ""


def _is(value: object, t: str) -> bool:
    if isinstance(value, bool) and t in ("integer", "number"):
        return False
    if t == "number" and isinstance(value, float):
        return True
    return isinstance(value, _TYPES.get(t, (object,)))


def _shown(value: object) -> str:
    text = json.dumps(value, default=repr, ensure_ascii=False)
    return text if len(text) <= 60 else text[:59] + "…"


# -- what readers see ------------------------------------------------------------------------

def edit_of(request: Mapping[str, Any], decision: Mapping[str, Any]) -> dict[str, Any] | None:
    """The edit a decision made to its request (None: approved or refused as asked)."""
    if decision.get("arguments") is None:
        return None
    try:
        shown = json.loads(request.get("summary") or "")
    except ValueError:
        shown = request.get("summary")
    original = shown.get("arguments", shown) if isinstance(shown, dict) else shown
    return {"approval": decision["digest"], "by": decision.get("decided_by"),
            "original": original, "arguments": masked(decision["arguments"])}


def edits(approvals: Iterable[Mapping[str, Any]],
          decisions: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The edits of a run's decisions, by request digest (each with its ``task_key``
    and ``ref``)."""
    made = {d["digest"]: d for d in decisions if d.get("arguments") is not None}
    out: dict[str, dict[str, Any]] = {}
    for r in approvals:
        d = made.get(r["digest"])
        edit = edit_of(r, d) if d is not None else None
        if edit is not None:
            out[r["digest"]] = {**edit, "task_key": r["task_key"],
                                "ref": (spec_of(r) or {}).get("ref")}
    return out


def approvals_with_edits(rows: list[dict[str, Any]],
                         decisions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (approvals rows), each with ``edit`` (None: not edited)."""
    found = edits(rows, decisions)
    return [{**r, "edit": _public(found.get(r["digest"]))} for r in rows]


def calls_with_edits(calls: list[dict[str, Any]], approvals: Iterable[Mapping[str, Any]],
                     decisions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool call rows, each with ``edit``: the edit of the approval it ran under (None)."""
    by_ref = {(e["task_key"], e["ref"]): e for e in edits(approvals, decisions).values()
              if e["ref"]}
    return [{**c, "edit": _public(by_ref.get((c.get("task_key"), c.get("arguments_digest"))))}
            for c in calls]


def _public(edit: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if edit is None else {k: edit[k] for k in ("approval", "by", "original",
                                                            "arguments")}
