"""Declarative pipelines: a JSON or TOML file listing tasks and ``after`` edges.

Example ``etl.toml``::

    name = "etl"
    [tasks.extract]
    task = "mypkg.steps:extract"
    args = { url = "https://example.org/data.csv" }
    [tasks.load]
    task = "mypkg.steps:load"
    inputs = { rows = "extract" }     # pass extract's result as argument rows
    after = ["extract"]

Tasks are found by import path and must be ``@task`` functions. This is the
one way to write a cycle or an unknown name, so validation here reports
every problem at once, naming the cycle.
"""

from __future__ import annotations

import graphlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from .errors import InputError
from .graph import Graph, Node
from .pipeline import Pipeline
from .task import Task, TaskRef


def _resolve(path: str, problems: list[str], name: str) -> Task[..., Any] | None:
    mod_name, _, attr = path.partition(":")
    if not attr:
        problems.append(f"task {name!r}: import path {path!r} must look like 'module:function'")
        return None
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        problems.append(f"task {name!r}: cannot import {mod_name!r} ({exc})")
        return None
    obj = getattr(module, attr, None)
    if obj is None:
        problems.append(f"task {name!r}: {mod_name!r} has no attribute {attr!r}")
        return None
    if not isinstance(obj, Task):
        kind = "a plain function" if callable(obj) else type(obj).__name__
        problems.append(f"task {name!r}: {path!r} is {kind}, not a @task")
        return None
    return obj


def load_spec(path: str | Path) -> Pipeline[..., Any]:
    """Read a spec file and return a pipeline whose graph it describes."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(f"cannot read spec {path}: {exc.strerror}",
                         hint="pass an existing .json or .toml file") from None
    try:
        if p.suffix == ".toml":
            import tomllib
            doc = tomllib.loads(text)
        else:
            doc = json.loads(text)
    except ValueError as exc:
        raise InputError(f"spec {path} is not valid {p.suffix[1:].upper()}: {exc}",
                         hint="fix the file's syntax") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), dict):
        raise InputError(f"spec {path} has no [tasks] table",
                         hint="list tasks as tasks.<name> = {task = 'module:function'}")
    folder = str(p.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = str(doc.get("name") or p.stem)
    return SpecPipeline(name, doc["tasks"], str(p.resolve()))


class SpecPipeline(Pipeline[..., Any]):
    """A pipeline defined by a spec file instead of a function body."""

    def __init__(self, name: str, tasks: dict[str, Any], path: str) -> None:
        def body() -> None:
            return None
        body.__name__ = name
        super().__init__(body, name)
        self.tasks = tasks
        self.path = path

    def target(self) -> str | None:
        return self.path

    def build(self, *args: Any, **params: Any) -> Graph:
        graph = Graph(self.name, may_cycle=True)
        problems = graph.problems
        for key, entry in self.tasks.items():
            if not isinstance(entry, dict) or "task" not in entry:
                problems.append(f"task {key!r} needs a 'task' import path")
                continue
            t = _resolve(str(entry["task"]), problems, key)
            after = tuple(str(a) for a in entry.get("after", []))
            inputs = {str(k): str(v) for k, v in dict(entry.get("inputs", {})).items()}
            kwargs: dict[str, Any] = dict(entry.get("args", {}))
            kwargs.update({k: TaskRef(v) for k, v in inputs.items()})
            if t is None:
                continue
            graph.nodes[key] = Node(key, t, False, (), kwargs, tuple(dict.fromkeys(inputs.values())),
                                    after, where=self.path, has_refs=bool(inputs))
        graph.validate()
        order = graphlib.TopologicalSorter({k: n.upstream for k, n in graph.nodes.items()})
        graph.nodes = {k: graph.nodes[k] for k in order.static_order()}
        return graph
