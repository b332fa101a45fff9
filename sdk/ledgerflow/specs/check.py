"""The check of a declarative spec: every problem of a JSON or TOML list of steps, at once.

Example ``etl.toml``::

    name = "etl"
    [tasks.extract]
    task = "mypkg.steps:extract"
    args = { url = "https://example.org/data.csv" }
    [tasks.load]
    task = "mypkg.steps:load"
    inputs = { rows = "extract" }     # pass extract's result as argument rows
    after = ["extract"]               # (implied by inputs; for ordering without data)
    [tasks.parse]
    task = "steps.py:parse"           # a module by path, from the spec's folder
    map = "extract"                   # one parse per item of extract's list result
    key = "id"                        # each item's key (default: the item or its hash)

A step's fields are ``task`` (an import path, see :mod:`ledgerflow.specs.catalogue`),
``args`` (literal arguments), ``inputs`` (argument -> the step whose result it
gets), ``map`` (fan out over a step's list result, or element-wise over
another fan-out; each item goes to the task's first parameter), ``key`` and
``after``. This is the one way to write a cycle or an unknown name, so
:func:`check` reports every problem at once, each as a
:class:`~ledgerflow.specs.problems.Problem` with its path in the spec: unknown
tasks and fields, missing, unknown or mistyped arguments (from the type
hints), references to unknown steps, cycles (named), an upstream result
type that does not fit the parameter it feeds (from return annotations), and
what a :class:`~ledgerflow.specs.policy.Policy` does not allow; steps with an
approval gate are notes. ``pipeline validate`` prints the report;
:class:`~ledgerflow.specs.pipeline.SpecPipeline` (``pipeline run spec.toml``) refuses to build a graph
from a spec that has problems.

A spec written by ``pipeline draft`` carries a header that marks it
machine-written (:mod:`ledgerflow.specs.drafts`); it runs only once its digest
has been approved.
"""

from __future__ import annotations

import difflib
import graphlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import InputError
from ..graph import cycles
from . import drafts
from .catalogue import NO_DEFAULT, TaskInfo, Unresolved, describe, resolve
from .hints import describe as type_text
from .hints import element_type, example, json_kind, show, type_fits, value_fits
from .policy import Policy, StepUse
from .policy import check as check_policy
from .problems import NOTE, Problem, step_path
from .touches import races

#: The fields a step may have, and the top-level keys of a spec.
STEP_FIELDS: Final = ("task", "args", "inputs", "map", "key", "after")
TOP_FIELDS: Final = ("name", "description", "tasks", drafts.JSON_KEY)


@dataclass(slots=True)
class Step:
    """One step of a spec whose task was found."""

    key: str
    info: TaskInfo
    args: dict[str, Any]
    inputs: dict[str, str]
    map: str | None = None
    item_key: str | None = None
    after: tuple[str, ...] = ()

    @property
    def upstream(self) -> list[tuple[str, tuple[str | int, ...]]]:
        """Each step this one waits for, with the field that says so."""
        out: list[tuple[str, tuple[str | int, ...]]] = []
        if self.map is not None:
            out.append((self.map, ("map",)))
        out += [(up, ("inputs", param)) for param, up in self.inputs.items()]
        out += [(up, ("after", i)) for i, up in enumerate(self.after)]
        return out


@dataclass(slots=True)
class Report:
    """Everything :func:`check` found: problems (errors), notes, the steps, the order."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    steps: dict[str, Step] = field(default_factory=dict)
    #: Steps in an order they can run in (empty when there is a cycle).
    order: list[str] = field(default_factory=list)
    cycles: list[list[str]] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """True when there is no problem (notes do not count)."""
        return not self.problems

    def add(self, path: str, code: str, message: str, hint: str = "") -> None:
        self.problems.append(Problem(path=path, code=code, message=message, hint=hint))

    def plan(self) -> list[dict[str, Any]]:
        """What would run, in order: each step's task, fan-out, upstream and gate."""
        rows = []
        for key in self.order:
            s = self.steps.get(key)
            if s is None:
                continue
            gate = s.info.task.options.approve
            rows.append({"step": key, "task": s.info.ref, "map": s.map,
                         "waits_for": list(dict.fromkeys(u for u, _ in s.upstream)),
                         "gate": gate is not None,
                         "approvers": list(gate.approvers) if gate else [],
                         "cache": s.info.task.options.cache})
        return rows

    def as_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "problems": [p.as_dict() for p in self.problems],
                "notes": [p.as_dict() for p in self.notes]}


def check_draft(doc: object, header: drafts.DraftHeader, *, folder: str,
                policy: Policy | None = None, cwd: str | None = None) -> Report:
    """Check a machine-written draft as data: its steps may name only the tasks of the
    catalogue it was drafted over (``header.tasks``), so nothing else is imported.

    The catalogue's sources are what a person gave ``pipeline draft``; a step naming
    anything else is ``task.unknown``, approved or not. Without ``policy``, the
    policy the draft was drafted under (``header.policy``) is read again, as it is now.

    Raises:
        InputError: the draft's policy cannot be read.
    """
    from .catalogue import find_tasks
    from .policy import load_policy
    if policy is None and header.policy:
        try:
            policy = load_policy(header.policy)
        except InputError as exc:
            raise InputError(f"the draft was drafted under policy {header.policy}, which "
                             f"cannot be used now: {exc}",
                             hint="restore that policy file, or name one: --policy "
                             "POLICY.toml") from None
    cat = find_tasks(header.tasks, base=folder)
    rep = check(doc, folder=folder, policy=policy, cwd=cwd, only=cat.tasks)
    if not header.tasks:
        rep.problems.insert(0, Problem(
            path="", code="draft.no_catalogue",
            message="the draft's header does not say which tasks it was drafted over "
            "(no draft-tasks line), so none of its steps can be checked without importing "
            "what the draft names", hint="draft it again (pipeline draft ... --tasks ...), "
            "or delete the header to make it a hand-written spec"))
    return rep


def _near(word: str, options: list[str]) -> str:
    found = difflib.get_close_matches(word, options, n=1)
    return f"did you mean {found[0]!r}? " if found else ""


def check(doc: object, *, folder: str | None = None, policy: Policy | None = None,
          cwd: str | None = None, only: Mapping[str, TaskInfo] | None = None) -> Report:
    """Check a spec document (the parsed JSON/TOML); report every problem with its path.

    Args:
        doc: the parsed spec.
        folder: the spec's folder (relative ``file.py:task`` references start there).
        policy: also report what this policy does not allow.
        cwd: the folder relative paths in arguments are taken from, for the policy.
        only: the tasks steps may name, by reference (a draft's catalogue): any other
            reference is unknown, and nothing is imported to find out.

    Example:
        >>> r = check({"tasks": {"a": {"task": "nowhere:x"}}})
        >>> [p.code for p in r.problems]
        ['task.unknown']
    """
    rep = Report()
    if not isinstance(doc, Mapping):
        rep.add("", "spec.not_a_table", "a spec is a table with a [tasks] table",
                "list tasks as tasks.<name> = {task = 'module:function'}")
        return rep
    for k in doc:
        if k not in TOP_FIELDS:
            rep.add(str(k), "spec.unknown_field", f"unknown top-level key {k!r}",
                    _near(str(k), list(TOP_FIELDS)) + "a spec has: name, description, tasks")
    for k in ("name", "description"):
        if k in doc and not isinstance(doc[k], str):
            rep.add(k, "spec.type", f"{k} must be a string, given {json_kind(doc[k])}",
                    f'{k} = "..."')
    tasks = doc.get("tasks")
    if not isinstance(tasks, Mapping) or not tasks:
        rep.add("tasks", "spec.no_tasks", "the spec has no [tasks] table" if tasks is None
                else "[tasks] must be a non-empty table of steps",
                "list steps as tasks.<name> = {task = 'module:function'}")
        return rep
    raw: dict[str, Mapping[str, Any]] = {}
    for key, entry in tasks.items():
        key = str(key)
        if not isinstance(entry, Mapping):
            rep.add(step_path(key), "step.not_a_table", f"step {key!r} must be a table",
                    f"[tasks.{key}]\ntask = \"module:function\"")
            continue
        raw[key] = entry
    modules: dict[str, Any] = {}           # each module a step names, looked up once
    for key, entry in raw.items():
        step = _check_step(rep, key, entry, raw, folder, only, modules)
        if step is not None:
            rep.steps[key] = step
    _check_names(rep)
    _check_graph(rep, raw)
    _check_types(rep)
    for key, s in rep.steps.items():
        gate = s.info.task.options.approve
        if gate is not None:
            who = f" (by {', '.join(gate.approvers)})" if gate.approvers else ""
            each = " for each item" if s.map else ""
            rep.notes.append(Problem(
                path=step_path(key), code="approval.required", severity=NOTE,
                message=f"step {key!r} waits for a person's approval{who}{each} before it runs",
                hint=f"decide it when asked: pipeline approve RUN_ID {key} --digest ..."))
    uses = [StepUse(key=k, ref=s.info.ref, task=s.info.task,
                    args={**{p.name: p.default for p in s.info.params
                             if p.default is not NO_DEFAULT},
                          **_fitting(s)},     # a mistyped value is reported once, above
                    fed={**dict(s.inputs),
                         **({s.info.first.name: s.map} if s.map and s.info.first else {})},
                    is_map=s.map is not None)
            for k, s in rep.steps.items()]
    if rep.order:
        ups = {k: [u for u, _ in s.upstream] for k, s in rep.steps.items()}
        rep.problems += races(uses, rep.order, ups, policy, cwd)
    if policy is not None:
        rep.problems += check_policy(uses, policy, folder=folder, cwd=cwd)
    rep.problems.sort(key=lambda p: p.path)
    return rep


def _fitting(s: Step) -> dict[str, Any]:
    """The step's literal arguments that fit their parameters' types."""
    out = {}
    for name, value in s.args.items():
        p = s.info.param(name)
        if p is None or value_fits(value, p.hint):
            out[name] = value
    return out


def _check_step(rep: Report, key: str, entry: Mapping[str, Any],
                raw: Mapping[str, Mapping[str, Any]], folder: str | None,
                only: Mapping[str, TaskInfo] | None = None,
                modules: dict[str, Any] | None = None) -> Step | None:
    """Check one step's own fields; return it when its task was found."""
    for f in entry:
        if f not in STEP_FIELDS:
            rep.add(step_path(key, str(f)), "step.unknown_field",
                    f"step {key!r} has an unknown field {f!r}",
                    _near(str(f), list(STEP_FIELDS)) + "a step has: " + ", ".join(STEP_FIELDS))
    ref = entry.get("task")
    info: TaskInfo | None = None
    if not isinstance(ref, str) or not ref:
        rep.add(step_path(key, "task"), "task.missing", f"step {key!r} needs a 'task' import path",
                'task = "module:function"')
    elif only is not None and ref not in only:
        rep.add(step_path(key, "task"), "task.unknown",
                f"step {key!r}: {ref!r} is not one of the tasks this draft may use",
                _near(ref, list(only)) + "use one of: " + ", ".join(sorted(only)))
    elif only is not None:
        info = only[ref]
    else:
        found = resolve(ref, folder, modules)
        if isinstance(found, Unresolved):
            rep.add(step_path(key, "task"), found.code, f"step {key!r}: {found.message}",
                    found.hint)
        else:
            info = describe(found, ref)
    args = entry.get("args", {})
    if not isinstance(args, Mapping):
        rep.add(step_path(key, "args"), "step.type", f"step {key!r}: args must be a table, "
                f"given {json_kind(args)}", "args = { name = value }")
        args = {}
    inputs = entry.get("inputs", {})
    if not isinstance(inputs, Mapping):
        rep.add(step_path(key, "inputs"), "step.type", f"step {key!r}: inputs must be a table of "
                f"step names, given {json_kind(inputs)}", 'inputs = { rows = "extract" }')
        inputs = {}
    good_inputs: dict[str, str] = {}
    for param, up in inputs.items():
        if not isinstance(up, str):
            rep.add(step_path(key, "inputs", str(param)), "step.type",
                    f"step {key!r}: inputs.{param} must name a step, given {json_kind(up)}",
                    f'inputs = {{ {param} = "STEP" }}')
            continue
        good_inputs[str(param)] = up
    source = entry.get("map")
    if source is not None and not isinstance(source, str):
        rep.add(step_path(key, "map"), "step.type", f"step {key!r}: map must name a step, given "
                f"{json_kind(source)}", 'map = "STEP"')
        source = None
    item_key = entry.get("key")
    if item_key is not None and not isinstance(item_key, str):
        rep.add(step_path(key, "key"), "step.type", f"step {key!r}: key must be a field name, "
                f"given {json_kind(item_key)}", 'key = "id"')
        item_key = None
    if item_key is not None and source is None:
        rep.add(step_path(key, "key"), "step.key_without_map",
                f"step {key!r} has a key but no map", 'add map = "STEP", or remove key')
    after = entry.get("after", [])
    if isinstance(after, str):
        after = [after]
    good_after: list[str] = []
    if not isinstance(after, list):
        rep.add(step_path(key, "after"), "step.type", f"step {key!r}: after must be a list of "
                f"step names, given {json_kind(after)}", 'after = ["STEP"]')
    else:
        for i, up in enumerate(after):
            if isinstance(up, str):
                good_after.append(up)
            else:
                rep.add(step_path(key, "after", i), "step.type",
                        f"step {key!r}: after[{i}] must name a step, given {json_kind(up)}",
                        'after = ["STEP"]')
    refs: list[tuple[str, tuple[str | int, ...]]] = []
    if source is not None:
        refs.append((source, ("map",)))
    refs += [(up, ("inputs", p)) for p, up in good_inputs.items()]
    refs += [(up, ("after", i)) for i, up in enumerate(good_after)]
    for up, where in refs:
        if up not in raw:
            names = list(raw)
            rep.add(step_path(key, *where), "ref.unknown",
                    f"step {key!r} depends on unknown task {up!r}: no step has that name",
                    _near(up, names) + "steps: " + ", ".join(names))
    if info is None:
        return None
    _check_arguments(rep, key, info, args, good_inputs, source)
    return Step(key, info, dict(args), good_inputs, source, item_key, tuple(good_after))


def _check_arguments(rep: Report, key: str, info: TaskInfo, args: Mapping[str, Any],
                     inputs: Mapping[str, str], source: str | None) -> None:
    name = info.ref.rpartition(":")[2]
    params = [p.name for p in info.params]
    mapped = info.first.name if source is not None and info.first is not None else None
    if source is not None and info.first is None:
        rep.add(step_path(key, "map"), "map.no_param",
                f"step {key!r} maps over {source!r}, but {info.signature} has no positional "
                "parameter to take each item", "remove map, or use a task whose first "
                "parameter takes one item")
    for kind, given in (("args", list(args)), ("inputs", list(inputs))):
        for pname in given:
            if info.param(pname) is None and not info.var_kwargs:
                rep.add(step_path(key, kind, pname), "arg.unknown",
                        f"step {key!r}: {name} has no parameter {pname!r}",
                        _near(pname, params) + f"its signature is {info.signature}")
    for pname in sorted(set(args) & set(inputs)):
        rep.add(step_path(key, "inputs", pname), "arg.twice",
                f"step {key!r}: {pname!r} is given in args and in inputs",
                "keep one of them")
    if mapped is not None and (mapped in args or mapped in inputs):
        where = "args" if mapped in args else "inputs"
        rep.add(step_path(key, where, mapped), "arg.twice",
                f"step {key!r}: {mapped!r} takes each item of map = {source!r}, and is "
                f"given in {where} too", f"remove {where}.{mapped}")
    for p in info.params:
        if p.name in args:
            value = args[p.name]
            if not value_fits(value, p.hint):
                if p.schema is None:
                    msg = (f"step {key!r}: {p.name} is {p.type_text}, which no literal can be; "
                           f"given {json_kind(value)}")
                    hint = f'feed it from a step: inputs = {{ {p.name} = "STEP" }}'
                else:
                    msg = (f"step {key!r}: argument {p.name} is {show(value)} "
                           f"({json_kind(value)}), but {name} takes {p.type_text}")
                    hint = f"give {p.name} as {example(p.schema)}"
                rep.add(step_path(key, "args", p.name), "arg.type", msg, hint)
        elif p.required and p.name not in inputs and p.name != mapped:
            if p.schema is None:
                hint = f'feed it from a step: inputs = {{ {p.name} = "STEP" }}'
            else:
                hint = (f"add args.{p.name} ({example(p.schema)}), or feed it from a step: "
                        f'inputs = {{ {p.name} = "STEP" }}')
            rep.add(step_path(key, "args", p.name), "arg.missing",
                    f"step {key!r}: {name} needs argument {p.name} ({p.type_text})", hint)


def _check_names(rep: Report) -> None:
    seen: dict[str, Step] = {}
    for s in rep.steps.values():
        other = seen.setdefault(s.info.task.name, s)
        if other is not s and other.info.task.fn is not s.info.task.fn:
            rep.add(step_path(s.key, "task"), "task.duplicate_name",
                    f"steps {other.key!r} and {s.key!r} use two different tasks both named "
                    f"{s.info.task.name!r} ({other.info.ref} and {s.info.ref})",
                    "rename one of them: @task(name=...)")


def _edges(raw: Mapping[str, Mapping[str, Any]]) -> dict[str, list[tuple[str, tuple[str | int, ...]]]]:
    """Each step's upstream steps (that exist), with the field naming them."""
    out: dict[str, list[tuple[str, tuple[str | int, ...]]]] = {}
    for key, entry in raw.items():
        ups: list[tuple[str, tuple[str | int, ...]]] = []
        if isinstance(entry.get("map"), str) and entry["map"] in raw:
            ups.append((entry["map"], ("map",)))
        inputs = entry.get("inputs")
        if isinstance(inputs, Mapping):
            ups += [(v, ("inputs", str(k))) for k, v in inputs.items()
                    if isinstance(v, str) and v in raw]
        after = entry.get("after", [])
        if isinstance(after, str):
            after = [after]
        if isinstance(after, list):
            ups += [(v, ("after", i)) for i, v in enumerate(after)
                    if isinstance(v, str) and v in raw]
        out[key] = ups
    return out


def _check_graph(rep: Report, raw: Mapping[str, Mapping[str, Any]]) -> None:
    edges = _edges(raw)
    for cycle in cycles({k: [u for u, _ in ups] for k, ups in edges.items()}):
        rep.cycles.append(cycle)
        first, second = cycle[0], cycle[1]
        where = next(w for u, w in edges[first] if u == second)
        rep.add(step_path(first, *where), "graph.cycle",
                "cycle: " + " -> ".join(cycle) + " (each step waits for the next)",
                f"remove one of these dependencies, e.g. {step_path(first, *where)}")
    if rep.cycles:
        return
    sorter = graphlib.TopologicalSorter({k: [u for u, _ in ups] for k, ups in edges.items()})
    rep.order = list(sorter.static_order())


def _check_types(rep: Report) -> None:
    """Does each upstream result fit the parameter it feeds (from the annotations)?"""
    steps = rep.steps
    for s in steps.values():
        name = s.info.ref.rpartition(":")[2]
        for param, up_key in s.inputs.items():
            up, p = steps.get(up_key), s.info.param(param)
            if up is None or p is None:
                continue
            kind = _produced(up)
            if not type_fits(kind, p.hint):
                is_list, item = element_type(kind)
                hint = (f'fan out over it instead: map = "{up_key}" (each item goes to '
                        f"{s.info.first.name})" if is_list and type_fits(item, p.hint)
                        and s.info.first is not None and s.info.first.name == param
                        and s.map is None else
                        f"feed {param} from a step that returns {p.type_text}")
                rep.add(step_path(s.key, "inputs", param), "input.type",
                        f"step {up_key!r} returns {type_text(kind)}, but {name} takes "
                        f"{param}: {p.type_text}", hint)
        if s.map is not None and s.map in steps and s.info.first is not None:
            up = steps[s.map]
            kind = _produced(up)
            is_list, item = element_type(kind)
            first = s.info.first
            if not is_list:
                rep.add(step_path(s.key, "map"), "map.not_a_list",
                        f"step {s.map!r} returns {type_text(kind)}, not a list: {s.key!r} "
                        "cannot fan out over it",
                        f'pass it whole instead: inputs = {{ {first.name} = "{s.map}" }}')
            elif not type_fits(item, first.hint):
                rep.add(step_path(s.key, "map"), "map.type",
                        f"each item of step {s.map!r} is {type_text(item)}, but {name} takes "
                        f"{first.name}: {first.type_text}",
                        f"map over a step whose items are {first.type_text}")


def _produced(up: Step) -> Any:
    """The type a step's result has downstream (a fan-out gives the list of its results)."""
    if up.map is not None:
        return list[up.info.returns]  # type: ignore[name-defined]
    return up.info.returns
