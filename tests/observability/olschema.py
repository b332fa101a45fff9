"""Check OpenLineage events against what openlineage-python ships of the spec.

The spec's JSON Schema files (``OpenLineage.json``, ``facets/*.json``) are
not in the openlineage-python wheel nor in its dependencies (checked:
openlineage-python 1.54, openlineage-integration-common,
apache-airflow-providers-openlineage). What it ships is the spec compiled
to attrs classes (``openlineage.client.generated``), one per schema
definition, each naming its schema (``_get_schema()``) and checking types,
required fields, UUIDs, ISO times and enums when built. So an event is
valid here when it can be rebuilt from its JSON with those classes (an
unknown or missing field fails), every facet found by its ``_schemaURL``,
and the rebuilt event serialises back to the same JSON. Our own facets are
checked against the JSON Schemas shipped in ``ledgerflow_observability/schemas``.
"""

from __future__ import annotations

import enum
import importlib
import json
import pkgutil
import types
import typing
from pathlib import Path
from typing import Any

import attr
import jsonschema
from openlineage.client import generated
from openlineage.client.event_v2 import RunEvent
from openlineage.client.serde import Serde

import ledgerflow_observability
from ledgerflow_observability import _olfacets

SCHEMAS = Path(ledgerflow_observability.__file__).parent / "schemas"


def _facet_classes() -> dict[str, type[Any]]:
    out: dict[str, type[Any]] = {}
    for mod in pkgutil.iter_modules(generated.__path__):
        module = importlib.import_module(f"{generated.__name__}.{mod.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and attr.has(obj) and "_get_schema" in vars(obj):
                out.setdefault(obj._get_schema(), obj)
    for cls in _olfacets.CUSTOM_FACETS:
        out[cls._get_schema()] = cls
    return out


FACETS = _facet_classes()


def _build(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _build(args[0], value)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_build(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(tp)
        return {k: _build(item, v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if isinstance(tp, type) and attr.has(tp):
        return build(tp, value)
    return value


def build(cls: type[Any], doc: dict[str, Any]) -> Any:
    """``cls`` (an attrs class of the client) built from ``doc``; facets by _schemaURL."""
    if "_schemaURL" in doc:
        found = FACETS.get(doc["_schemaURL"])
        assert found is not None, f"no schema definition ships for {doc['_schemaURL']}"
        assert issubclass(found, cls), (found, cls)
        cls = found
    attr.resolve_types(cls)
    fields = {f.name: f for f in attr.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in doc.items():
        if key in ("_schemaURL", "schemaURL"):
            continue
        name = key
        f = fields.get(name)
        assert f is not None, f"{cls.__name__} has no field {key!r}"
        init = f.alias if getattr(f, "alias", None) else name.lstrip("_")
        kwargs[init] = _build(f.type, value)
    obj = cls(**kwargs)
    schema_field = "_schemaURL" if "_schemaURL" in fields else "schemaURL"
    if schema_field in doc:
        assert doc[schema_field] == getattr(obj, schema_field), (doc[schema_field], cls)
    return obj


def check_event(doc: dict[str, Any]) -> RunEvent:
    """Validate one event (see the module docstring); return it rebuilt."""
    event = build(RunEvent, doc)
    assert json.loads(Serde.to_json(event)) == doc, "the event does not round-trip"
    for facet in _custom_facets(doc):
        name = facet["_schemaURL"].rsplit("/", 1)[-1]
        schema = json.loads((SCHEMAS / f"{name}.json").read_text())
        jsonschema.validate(facet, schema)
    return event  # type: ignore[no-any-return]


def _custom_facets(doc: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(doc, dict):
        if str(doc.get("_schemaURL", "")).startswith("urn:ledgerflow:"):
            out.append(doc)
        for v in doc.values():
            out += _custom_facets(v)
    elif isinstance(doc, list):
        for v in doc:
            out += _custom_facets(v)
    return out
