"""The run's task graph as data: one node per task, fan-outs folded, per task name when large.

:func:`graph` is what ``/api/runs/ID/graph`` returns and what
:func:`ledgerflow_console.charts.graph_svg` draws in layers by depth.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ledgerflow.views import RunView, TaskRow

from .views import TIMES

#: Tasks drawn one node each; larger runs are drawn with one node per task name.
GRAPH_NODES: Final = 150
#: A fan-out with more items than this is drawn as one node (count and state bar).
FANOUT_NODES: Final = 8


def _task_graph(view: RunView) -> dict[str, Any]:
    """One node per task, a fan-out of more than :data:`FANOUT_NODES` items as one node."""
    tasks = view.tasks
    items: dict[str, list[TaskRow]] = {}
    for r in tasks.values():
        if r.position is not None and r.node:
            items.setdefault(r.node, []).append(r)
    node_of = {r.key: r.key for r in tasks.values()}
    folded = {n: rows for n, rows in items.items() if len(rows) > FANOUT_NODES}
    for n, rows in folded.items():
        for r in rows:
            node_of[r.key] = n
    nodes: list[dict[str, Any]] = []
    seen: set[str] = set()
    for r in tasks.values():
        me = node_of[r.key]
        if me in seen:
            continue
        seen.add(me)
        if me in folded:
            c: dict[str, int] = {}
            for x in folded[me]:
                c[x.state] = c.get(x.state, 0) + 1
            name = r.task_name or me
            nodes.append({"key": me, "label": f"{name} {TIMES}{len(folded[me]):,}",
                          "state": _worst(c), "tasks": len(folded[me]), "counts": c,
                          "fan_out": True, "task": name})
        else:
            nodes.append({"key": r.key, "label": r.key, "state": r.state, "tasks": 1,
                          "counts": {r.state: 1}})
    # an upstream that names a fan-out stands for all of its items
    pairs: dict[tuple[str, str], None] = {}
    for r in tasks.values():
        me = node_of[r.key]
        for u in r.upstream:
            srcs = [node_of[u]] if u in tasks else (
                [u] if u in folded else [x.key for x in items.get(u, [])])
            for src in srcs:
                if src != me:
                    pairs[(src, me)] = None
    return {"collapsed": False, "fanouts_collapsed": len(folded), "nodes": nodes,
            "edges": [{"from": a, "to": b} for a, b in pairs]}


def _worst(states: Mapping[str, int]) -> str:
    for s in ("failed", "upstream_failed", "cancelled", "cancelling", "running", "retry_wait",
              "waiting_approval", "ready", "pending", "succeeded"):
        if states.get(s):
            return s
    return next(iter(states), "pending")


def graph(view: RunView) -> dict[str, Any]:
    """The run's task graph: one node per task, or per task name for large runs.

    A collapsed node carries its task count and counts by state; its colour
    is the most urgent state among them (failed before running before done).
    """
    tasks = view.tasks
    if len(tasks) <= GRAPH_NODES:
        return _task_graph(view)
    name_of = {r.key: (r.task_name or r.key) for r in tasks.values()}
    node_name: dict[str, str] = {}
    for r in tasks.values():
        node_name.setdefault(r.node or r.key, r.task_name or r.key)
    counts: dict[str, dict[str, int]] = {}
    for r in tasks.values():
        c = counts.setdefault(name_of[r.key], {})
        c[r.state] = c.get(r.state, 0) + 1
    pairs: dict[tuple[str, str], None] = {}
    for r in tasks.values():
        me = name_of[r.key]
        for u in r.upstream:
            src = name_of.get(u) or node_name.get(u)
            if src is not None and src != me:
                pairs[(src, me)] = None
    nodes = [{"key": n, "label": f"{n} {TIMES}{sum(c.values()):,}" if sum(c.values()) > 1
              else n, "state": _worst(c), "tasks": sum(c.values()), "counts": c, "task": n}
             for n, c in counts.items()]
    return {"collapsed": True, "nodes": nodes,
            "edges": [{"from": a, "to": b} for a, b in pairs]}
