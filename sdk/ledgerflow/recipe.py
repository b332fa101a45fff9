"""The recorded graph: what a resume needs to rebuild the unfinished part without re-tracing.

When a run of a big plain pipeline starts, :func:`record` writes its graph as
a result file (the run's ``options["recipe"]`` names it): per call node its
key, its task's name, its literal arguments with references as
``{"$ref": key}``, its ``after=`` keys, and the code version of the modules
that define the pipeline and its tasks. A resume whose frontier read kept
most tasks (:mod:`ledgerflow.frontier`) asks :func:`partial` for a graph of
only the tasks left and their direct upstreams, decoding the arguments of
those alone: no body runs, and the kept tasks get no instance.

Anything the recorded form cannot hold exactly (a fan-out, a literal that
is not ``str``/``int``/``float``/``bool``/``None`` or a list or ``str``-keyed
dict of them, a task the pipeline's module does not name) means no recipe:
the resume re-traces the body, as it does when a module's source changed
since the run started (it says so in the log).
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from ._gc import quiet_gc
from .graph import Graph, Node
from .keys import digest
from .results import Encoded
from .task import Task, TaskRef
from .views import RunView, output_from_json

if TYPE_CHECKING:
    from .pipeline import Pipeline

log = logging.getLogger("ledgerflow")

#: Graphs with fewer nodes are re-traced (that costs about 2 µs a node).
MIN_NODES = 1000
VERSION = 1
_SCALARS = (str, int, bool, type(None))
_EMPTY: dict[str, Any] = {}


class Recipe(msgspec.Struct, frozen=True):
    """The recorded form (``args``: each node's ``[args, kwargs]``, decoded on demand)."""

    v: int
    pipeline: str
    code: str
    names: list[str]
    keys: list[str]
    tasks: list[int]
    args: list[msgspec.Raw]
    after: dict[str, list[str]] = {}


class _Unfit(Exception):
    """A value the recorded form cannot hold exactly."""


def record(pipe: Pipeline[..., Any], graph: Graph) -> Encoded | None:
    """The recipe of ``graph`` as a JSON result to store, or None (see the module docstring)."""
    if not getattr(pipe, "traced", False) or len(graph) < MIN_NODES:
        return None
    named = _tasks_of(pipe)
    if named is None:
        return None
    index: dict[Task[..., Any], int] = {}
    names: list[str] = []
    tasks: list[int] = []
    args: list[Any] = []
    after: dict[str, list[str]] = {}
    add_task, add_args, call = tasks.append, args.append, _call
    try:
        for node in graph.nodes.values():
            if node.is_map:
                return None
            t = node.task
            i = index.get(t)
            if i is None:
                if named.get(t.name) is not t:
                    return None
                i = index[t] = len(names)
                names.append(t.name)
            add_task(i)
            add_args(call(node))
            if node.after:
                after[node.key] = list(node.after)
    except _Unfit:
        return None
    keys = list(graph.nodes)
    code = source_version(pipe, [named[n] for n in names])
    if code is None:
        return None
    try:
        data = msgspec.json.encode({"v": VERSION, "pipeline": pipe.name, "code": code,
                                    "names": names, "keys": keys,
                                    "tasks": tasks, "args": args, "after": after})
    except (TypeError, OverflowError, msgspec.EncodeError):
        return None
    return Encoded("json", data, digest(data))


def recorded(pipe: Pipeline[..., Any], graph: Graph, store: Any) -> dict[str, str]:
    """``{"recipe": uri}`` for a new run's options once its recipe is stored, else ``{}``
    (and nothing is recorded for a store a resume cannot read it from: no frontier read)."""
    if getattr(store, "frontier", None) is None or getattr(store, "result_path", None) is None:
        return {}
    with quiet_gc():        # a list and a dict a node: the collector would rescan them
        enc = record(pipe, graph)
    uri = None if enc is None else store.put_blob(enc)
    return {} if uri is None else {"recipe": uri}


def resume_graph(pipe: Pipeline[..., Any], view: RunView, store: Any) -> Graph:
    """The graph a resume of ``view`` drives: the partial one when the recipe fits,
    else a new trace."""
    graph = partial(pipe, view, store)
    return graph if graph is not None else pipe.build(**msgspec.json.decode(view.params))


def partial(pipe: Pipeline[..., Any], view: RunView, store: Any) -> Graph | None:
    """A graph of the tasks ``view`` (a frontier read) leaves to run and their direct
    upstreams, from the run's recipe; None when there is none or it does not fit."""
    if not view.settled or not getattr(pipe, "traced", False):
        return None
    try:
        options = msgspec.json.decode(view.options or "{}")
    except msgspec.DecodeError:
        return None
    uri = options.get("recipe")
    path = getattr(store, "result_path", None)
    if not uri or path is None:
        return None
    try:
        with open(path(uri), "rb") as f:
            rec = msgspec.json.decode(f.read(), type=Recipe)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.info("run %s: its recorded graph is unreadable (%s); re-tracing", view.run_id, exc)
        return None
    if rec.v != VERSION or rec.pipeline != pipe.name:
        return None
    named = _tasks_of(pipe)
    if named is None or any(named.get(n) is None for n in rec.names) \
            or source_version(pipe, [named[n] for n in rec.names]) != rec.code:
        log.warning("run %s: the source of pipeline %s changed since the run started; "
                    "its body was traced again", view.run_id, pipe.name)
        return None
    graph = _build(rec, [named[n] for n in rec.names], view.settled, pipe.name)
    graph.output = output_from_json(options.get("output"))
    if any(key not in graph.nodes for key in view.tasks):
        return None         # a row the recorded graph does not know: only a trace drives it
    return graph


# -- the pieces ----------------------------------------------------------------------------

def _build(rec: Recipe, tasks: list[Task[..., Any]], kept: frozenset[str],
           name: str) -> Graph:
    """The nodes the kept successes ``kept`` leave, with their arguments, and as plain
    nodes their direct upstreams (kept successes: the runner restores them)."""
    graph = Graph(name, partial=True)
    ups: list[str] = []
    decode = msgspec.json.decode
    for i, key in enumerate(rec.keys):
        if key in kept:
            continue
        a, kw = decode(rec.args[i])
        deps: list[str] = []
        args = tuple([_back(x, deps) for x in a])
        kwargs = {k: _back(x, deps) for k, x in kw.items()} if kw else {}
        after = tuple(rec.after.get(key, ()))
        node = Node(key, tasks[rec.tasks[i]], False, args, kwargs,
                    tuple(dict.fromkeys(deps)), after, has_refs=bool(deps))
        graph.nodes[key] = node
        ups += node.upstream
    if not graph.nodes:
        return graph
    position = {k: i for i, k in enumerate(rec.keys)}
    for up in ups:
        if up not in graph.nodes:
            graph.nodes[up] = Node(up, tasks[rec.tasks[position[up]]], False, (), {}, ())
    # the order of the recorded graph (instances are made, and created, in it)
    graph.nodes = dict(sorted(graph.nodes.items(), key=lambda kv: position[kv[0]]))
    return graph


def _call(node: Node) -> list[Any]:
    """``[args, kwargs]`` of a call node, references as ``{"$ref": key}``."""
    out = [{"$ref": a.key} if type(a) is TaskRef
           else a if type(a) in _SCALARS else _plain(a) for a in node.args]
    return [out, {k: _plain(v) for k, v in node.kwargs.items()} if node.kwargs else _EMPTY]


def _plain(value: Any) -> Any:
    t = type(value)
    if t in _SCALARS or (t is float and math.isfinite(value)):
        return value
    if t is TaskRef:
        return {"$ref": value.key}
    if t is list:
        return [_plain(v) for v in value]
    if t is dict and "$ref" not in value and all(type(k) is str for k in value):
        return {k: _plain(v) for k, v in value.items()}
    raise _Unfit(t.__name__)


def _back(value: Any, deps: list[str]) -> Any:
    """A decoded argument with its references made :class:`TaskRef` again."""
    t = type(value)
    if t is dict:
        if len(value) == 1 and "$ref" in value:
            deps.append(value["$ref"])
            return TaskRef(value["$ref"])
        return {k: _back(v, deps) for k, v in value.items()}
    if t is list:
        return [_back(v, deps) for v in value]
    return value


def _tasks_of(pipe: Pipeline[..., Any]) -> dict[str, Task[..., Any]] | None:
    """The tasks the pipeline body's module names, by task name (None: a name twice)."""
    found: dict[str, Task[..., Any]] = {}
    for v in getattr(pipe.fn, "__globals__", {}).values():
        if isinstance(v, Task):
            if found.setdefault(v.name, v) is not v:
                return None
    return found


def source_version(pipe: Pipeline[..., Any], tasks: Iterable[Task[..., Any]]) -> str | None:
    """A hash of the source files that shape the graph: the body's module and its
    tasks' (None: one is not loaded from a file, as in a notebook)."""
    paths = set()
    for fn in (pipe.fn, *(t.fn for t in tasks)):
        path = getattr(sys.modules.get(getattr(fn, "__module__", None) or ""), "__file__", None)
        if not path:
            return None
        paths.add(path)
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(paths):
        try:
            with open(path, "rb") as f:
                h.update(f.read() + b"\0")
        except OSError:
            return None
    return h.hexdigest()
