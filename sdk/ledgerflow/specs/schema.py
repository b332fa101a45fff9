"""The JSON Schema of a declarative spec over a catalogue of tasks (``pipeline spec-schema``).

Each step's ``task`` is an enum of the catalogue's import paths, and each
task's ``args`` follow its signature and type hints (:mod:`ledgerflow.specs.hints`):
a parameter is required unless it has a default, and a required one may come
from ``args``, from ``inputs`` (a step's result) or, for the first parameter,
from ``map``. What a schema cannot say (that a named step exists, that there
is no cycle, that an upstream result's type fits) is checked by
:func:`ledgerflow.specs.check.check`.
"""

from __future__ import annotations

import json
from typing import Any, Final

from .catalogue import NO_DEFAULT, Catalogue, TaskInfo
from .check import STEP_FIELDS
from .drafts import JSON_KEY

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"


def _default(value: Any) -> tuple[bool, Any]:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False, None
    return True, value


def step_schema(info: TaskInfo) -> dict[str, Any]:
    """The schema of one step that runs ``info``'s task."""
    props: dict[str, Any] = {}
    for p in info.params:
        if p.schema is None:
            continue            # no literal can be one: only inputs or map can feed it
        sub = dict(p.schema)
        sub.setdefault("description", p.type_text)
        if p.default is not NO_DEFAULT:
            ok, value = _default(p.default)
            if ok:
                sub["default"] = value
        props[p.name] = sub
    args: dict[str, Any] = {"type": "object", "properties": props}
    if not info.var_kwargs:
        args["additionalProperties"] = False
    names = [p.name for p in info.params]
    inputs: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"},
                              "description": "parameter -> the step whose result it gets"}
    if not info.var_kwargs:
        inputs["propertyNames"] = {"enum": names}
    schema: dict[str, Any] = {
        "type": "object",
        "description": info.signature + (f": {info.doc}" if info.doc else ""),
        "properties": {
            "task": {"const": info.ref},
            "args": args,
            "inputs": inputs,
            "map": {"type": "string", "description": "fan out over this step's list result; "
                    "each item goes to the first parameter"},
            "key": {"type": "string", "description": "the field of each item that keys it"},
            "after": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["task"],
        "additionalProperties": False,
    }
    wants: list[dict[str, Any]] = []
    first = info.first
    for p in info.params:
        if not p.required:
            continue
        ways: list[dict[str, Any]] = [
            {"required": ["inputs"], "properties": {"inputs": {"required": [p.name]}}}]
        if p.schema is not None:
            ways.insert(0, {"required": ["args"], "properties": {"args": {"required": [p.name]}}})
        if first is not None and p.name == first.name:
            ways.append({"required": ["map"]})
        wants.append({"anyOf": ways})
    if wants:
        schema["allOf"] = wants
    if info.gated:
        schema["description"] += " (waits for approval before it runs)"
    return schema


def spec_schema(catalogue: Catalogue) -> dict[str, Any]:
    """The JSON Schema of a spec whose steps run the catalogue's tasks.

    Example:
        >>> from ledgerflow.specs.catalogue import Catalogue
        >>> spec_schema(Catalogue())["properties"]["tasks"]["type"]
        'object'
    """
    refs = sorted(catalogue.tasks)
    defs = {ref: step_schema(catalogue.tasks[ref]) for ref in refs}
    step: dict[str, Any] = {
        "type": "object",
        "properties": {"task": {"enum": refs, "description": "the task's import path"}},
        "required": ["task"],
        "oneOf": [{"$ref": f"#/$defs/{_pointer(ref)}"} for ref in refs],
    }
    if not refs:
        step = {"type": "object", "properties": {f: {} for f in STEP_FIELDS},
                "required": ["task"], "description": "no tasks were found for this schema"}
    return {
        "$schema": DIALECT,
        "title": "ledgerflow pipeline spec",
        "description": "A declarative ledgerflow pipeline (pipeline run SPEC). Steps name "
                       "tasks by import path; inputs/map/after name other steps.",
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "description": {"type": "string"},
            "tasks": {"type": "object", "minProperties": 1, "additionalProperties": step},
            JSON_KEY: {"type": "object", "description": "the header of a machine-written "
                       "draft (pipeline draft); not part of its digest"},
        },
        "required": ["tasks"],
        "additionalProperties": False,
        "$defs": defs,
    }


def _pointer(ref: str) -> str:
    """``ref`` escaped for a JSON pointer (``~`` and ``/``)."""
    return ref.replace("~", "~0").replace("/", "~1")
