"""The static task graph a pipeline body (or a spec file) describes.

Nodes are task calls and ``.map`` fan-outs; edges come from references
passed as arguments and from ``after=``. :meth:`Graph.validate` reports every
problem at once. Fan-outs are expanded at run time by the scheduler.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import CycleError, DefinitionError, DuplicateTaskError
from .task import MapRef, Task, TaskRef

REF_TYPES = (TaskRef, MapRef)


@dataclass(slots=True, eq=False)
class Node:
    """One task call or one fan-out in the static graph."""

    key: str
    task: Task[..., Any]
    is_map: bool
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    deps: tuple[str, ...]            # node keys whose whole value (or completion) is needed
    after: tuple[str, ...] = ()
    source: Any = None               # map only: TaskRef, MapRef or a literal list
    item_key: str | Callable[[Any], object] | None = None
    where: str = ""
    has_refs: bool = False

    @property
    def upstream(self) -> tuple[str, ...]:
        """Every node key this node waits for."""
        src = self.source.key if isinstance(self.source, REF_TYPES) else None
        return (*self.deps, *self.after, *((src,) if src else ()))


@dataclass(slots=True, eq=False)
class Graph:
    """An ordered set of nodes plus the problems found while building it."""

    name: str
    nodes: dict[str, Node] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    output: Any = None
    #: Traced bodies cannot form cycles (a reference exists only after its call);
    #: spec files can, so only they pay for the cycle search.
    may_cycle: bool = False
    #: Only the tasks a resume left to run and their direct upstreams, rebuilt from
    #: the run's recorded graph (:mod:`ledgerflow.recipe`) instead of a trace.
    partial: bool = False

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def validate(self) -> Graph:
        """Raise one :class:`DefinitionError` listing every problem, or return self."""
        problems = list(self.problems)
        names: dict[str, Task[..., Any]] = {}
        duplicates: list[str] = []
        for node in self.nodes.values():
            other = names.setdefault(node.task.name, node.task)
            if other is not node.task and other.fn is not node.task.fn:
                duplicates.append(
                    f"task name {node.task.name!r} is used by two different functions: "
                    f"{_where(other)} and {_where(node.task)}")
            for up in node.upstream:
                if up not in self.nodes:
                    problems.append(f"task {node.key!r} depends on unknown task {up!r}")
        problems.extend(duplicates)
        problems = sorted(dict.fromkeys(problems))
        cycle = self.find_cycle() if self.may_cycle else None
        if cycle:
            raise CycleError(cycle, problems=[*problems, "cycle: " + " -> ".join(cycle)])
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            if duplicates:
                first = sorted(dict.fromkeys(duplicates))[0]
                raise DuplicateTaskError(
                    first + more, problems=problems,
                    hint="rename one of them: @task(name=...)"
                    + ("; all problems: " + "; ".join(problems) if more else ""))
            raise DefinitionError(problems[0] + more, problems=problems,
                                  hint="fix the pipeline definition; all problems: "
                                  + "; ".join(problems))
        return self

    def find_cycle(self) -> list[str] | None:
        """Return a cycle as a list of keys (first repeated at the end), or None."""
        found = cycles({n.key: [u for u in n.upstream if u in self.nodes]
                        for n in self.nodes.values()})
        return found[0] if found else None

    def edges(self) -> Iterator[tuple[str, str, str]]:
        """Yield ``(upstream, downstream, kind)``; kind is data, map or after."""
        for node in self.nodes.values():
            if isinstance(node.source, REF_TYPES):
                yield node.source.key, node.key, "map"
            for d in node.deps:
                yield d, node.key, "data"
            for a in node.after:
                yield a, node.key, "after"

    def to_mermaid(self) -> str:
        """Render as a Mermaid flowchart."""
        ids = {k: f"n{i}" for i, k in enumerate(self.nodes)}
        lines = ["flowchart TD"]
        for key, node in self.nodes.items():
            label = f"{key} (map)" if node.is_map else key
            lines.append(f'    {ids[key]}["{label}"]')
        arrows = {"data": "-->", "map": "==>", "after": "-.->"}
        for up, down, kind in self.edges():
            if up in ids and down in ids:
                lines.append(f"    {ids[up]} {arrows[kind]} {ids[down]}")
        return "\n".join(lines)

    def to_dot(self) -> str:
        """Render as Graphviz dot."""
        lines = [f'digraph "{self.name}" {{', "  rankdir=TB;"]
        for key, node in self.nodes.items():
            shape = "box3d" if node.is_map else "box"
            lines.append(f'  "{key}" [shape={shape}];')
        style = {"data": "solid", "map": "bold", "after": "dashed"}
        for up, down, kind in self.edges():
            lines.append(f'  "{up}" -> "{down}" [style={style[kind]}];')
        lines.append("}")
        return "\n".join(lines)

    def to_text(self) -> str:
        """Render one line per node with its upstream tasks."""
        out = []
        for key, node in self.nodes.items():
            ups = ", ".join(node.upstream)
            kind = " (map)" if node.is_map else ""
            out.append(f"{key}{kind}" + (f"  <- {ups}" if ups else ""))
        return "\n".join(out)


def cycles(graph: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """One cycle per strongly connected component, each ``[a, b, ..., a]`` (a waits for b).

    ``graph`` maps each node to the nodes it waits for. Tarjan's search, without
    recursion (a spec of 20,000 steps is one deep chain); each cycle is the
    shortest way back to the component's smallest node, and the list is sorted.

    Example:
        >>> cycles({"a": ["b"], "b": ["a"], "c": ["c"], "d": []})
        [['a', 'b', 'a'], ['c', 'c']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            succ = graph.get(node, [])
            if i < len(succ):
                work.append((node, i + 1))
                nxt = succ[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1 or node in graph.get(node, []):
                    comps.append(comp)
            if work:
                caller = work[-1][0]
                low[caller] = min(low[caller], low[node])
    out = []
    for comp in comps:
        members = set(comp)
        start = min(comp)
        parent: dict[str, str] = {}
        queue, end = deque([start]), None
        while queue and end is None:        # the shortest way back to start (BFS)
            node = queue.popleft()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    end = node
                    break
                if nxt in members and nxt not in parent:
                    parent[nxt] = node
                    queue.append(nxt)
        path = [start]
        node = end if end is not None else start
        while node != start:
            path.append(node)
            node = parent[node]
        path = [start, *reversed(path[1:]), start]
        out.append(path)
    return sorted(out)


def _where(t: Task[..., Any]) -> str:
    code = getattr(t.fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code else repr(t.fn)
