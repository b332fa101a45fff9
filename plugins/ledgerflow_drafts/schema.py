"""The schema a model drafts under: a spec whose steps are named after the catalogue's tasks.

The general spec schema (:func:`ledgerflow.specs.schema.spec_schema`) lets a
step have any name, so it cannot say which names ``inputs``, ``map`` and
``after`` may use. For decoding, each step is named after its task (so each
task is used at most once in a draft), which makes every reference an enum (and a step's ``task`` is implied by its name, so the model
does not spend tokens on import paths),
filtered by the type hints: ``inputs.P`` lists only the steps whose result
fits ``P``, ``map`` only those whose items (or, for a fan-out, results) fit
the first parameter (those whose types match exactly, when there are any). A required parameter no step can feed is required in
``args``; one a step can feed is required through its first way, in this
order: ``map`` (the first parameter), ``inputs``, ``args``. A model whose
decoding follows the schema (the ``local`` provider) therefore cannot name an
unknown task, leave out a required argument, give a literal of the wrong
type or wire a result into a parameter of another type; what remains for the
validator is what types cannot say (cycles, a map over a step that is not a
fan-out, the policy).
"""

from __future__ import annotations

from typing import Any, Final

from ledgerflow.specs.catalogue import Catalogue, TaskInfo
from ledgerflow.specs.hints import describe as describe_type
from ledgerflow.specs.hints import element_type, type_fits

#: Longest literal string, and most list items, the model may write (a small model
#: otherwise repeats itself until it runs out of tokens).
MAX_STRING: Final = 160
MAX_ITEMS: Final = 16


def _bounded(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with a maximum length on every string (decoding only)."""
    out = dict(schema)
    if out.get("type") == "string" and "enum" not in out:
        out["maxLength"] = MAX_STRING
    if out.get("type") == "array":
        out.setdefault("maxItems", MAX_ITEMS)
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _bounded(out[key])
    if "anyOf" in out:
        out["anyOf"] = [_bounded(s) for s in out["anyOf"]]
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _bounded(v) for k, v in out["properties"].items()}
    out.pop("description", None)
    out.pop("default", None)
    return out


def sources(cat: Catalogue) -> dict[str, dict[str, tuple[list[str], list[str]]]]:
    """For each task's short name and parameter: (steps that can feed it whole,
    steps it can fan out over), by the type hints."""
    short = cat.short_names()
    infos = {short[ref]: info for ref, info in cat.tasks.items()}
    out: dict[str, dict[str, tuple[list[str], list[str]]]] = {}
    for name, info in infos.items():
        per: dict[str, tuple[list[str], list[str]]] = {}
        for p in info.params:
            found: dict[bool, tuple[list[str], list[str]]] = {True: ([], []), False: ([], [])}
            for other, up in infos.items():
                if other == name:
                    continue
                as_map = list[up.returns]  # type: ignore[name-defined]
                is_list, item = element_type(up.returns)
                for exact, fits in ((True, _same), (False, type_fits)):
                    if fits(up.returns, p.hint) or fits(as_map, p.hint):
                        found[exact][0].append(other)
                    if (is_list and fits(item, p.hint)) or fits(up.returns, p.hint):
                        found[exact][1].append(other)
            # exact type matches when there are any (fewer, better choices), else what fits
            whole = found[True][0] or found[False][0]
            over = found[True][1] or found[False][1]
            per[p.name] = (whole, over)
        out[name] = per
    return out


def step_entry(info: TaskInfo, name: str, feeds: dict[str, tuple[list[str], list[str]]],
               names: list[str]) -> dict[str, Any]:
    """The decoding schema of the step ``name`` (running ``info``'s task)."""
    first = info.first
    args_props: dict[str, Any] = {p.name: _bounded(p.schema) for p in info.params
                                  if p.schema is not None}
    over = feeds.get(first.name, ([], []))[1] if first is not None else []
    # a first parameter that takes a fan-out's items comes from map, not inputs as well
    inputs_props = {p: {"type": "string", "enum": whole}
                    for p, (whole, _over) in feeds.items()
                    if whole and not (over and first is not None and p == first.name
                                      and first.required)}
    req_args, req_inputs, req_map = [], [], False
    for p in info.params:
        if not p.required:
            continue
        whole, _ = feeds.get(p.name, ([], []))
        if first is not None and p.name == first.name and over:
            req_map = True
        elif whole:
            req_inputs.append(p.name)
        elif p.schema is not None:
            req_args.append(p.name)
    props: dict[str, Any] = {}
    required: list[str] = []
    if over:
        props["map"] = {"type": "string", "enum": over}
        if req_map:
            required.append("map")
    if inputs_props:
        props["inputs"] = {"type": "object", "properties": inputs_props,
                           **({"required": req_inputs} if req_inputs else {})}
        if req_inputs:
            required.append("inputs")
    if args_props:
        props["args"] = {"type": "object", "properties": args_props,
                         **({"required": req_args} if req_args else {})}
        if req_args:
            required.append("args")
    others = [n for n in names if n != name]
    if others:
        props["after"] = {"type": "array", "items": {"type": "string", "enum": others},
                          "maxItems": min(len(others), 3)}
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def drafting_schema(cat: Catalogue) -> dict[str, Any]:
    """The JSON Schema of a draft over ``cat``, for constrained decoding (see the module)."""
    short = cat.short_names()
    feeds = sources(cat)
    names = [short[ref] for ref in cat.tasks]
    steps = {short[ref]: step_entry(info, short[ref], feeds[short[ref]], names)
             for ref, info in cat.tasks.items()}
    return {"type": "object",
            "properties": {"tasks": {"type": "object", "properties": steps}},
            "required": ["tasks"]}


def _same(produced: Any, expected: Any) -> bool:
    return describe_type(produced) == describe_type(expected) and describe_type(expected) != "Any"


def chain(cat: Catalogue) -> list[str]:
    """The longest run of tasks whose types fit exactly, each taking the previous one's
    result or its items as its first argument (a hint for a model; short names)."""
    short = cat.short_names()
    infos = [(short[ref], info) for ref, info in cat.tasks.items()]
    nexts: dict[str, list[str]] = {}
    for name, up in infos:
        is_list, item = element_type(up.returns)
        nexts[name] = [other for other, down in infos if other != name and down.first is not None
                       and (_same(up.returns, down.first.hint)
                            or (is_list and _same(item, down.first.hint)))]
    best: list[str] = []

    def walk(path: list[str]) -> None:
        nonlocal best
        if len(path) > len(best):
            best = list(path)
        for nxt in nexts[path[-1]]:
            if nxt not in path and len(path) < 12:
                walk([*path, nxt])

    for name, _info in infos:
        walk([name])
    return best if len(best) > 1 else []
