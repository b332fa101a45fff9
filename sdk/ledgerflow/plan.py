"""The run-time task graph: task instances, fan-outs and ready counts (no I/O).

A :class:`Plan` turns the static graph into task instances. Call nodes
become one :class:`Instance` each; ``.map`` nodes become a :class:`FanOut` whose
children are created when the items are known (the source task succeeded,
or the source fan-out expanded: chained maps are element-wise). Each
instance counts the upstream things it still waits for, as
``graphlib.TopologicalSorter`` does; the runner moves states and calls
:meth:`Plan.succeeded` / :meth:`Plan.failed` to learn what became ready.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .graph import Graph, Node
from .keys import canonical, item_key
from .states import FAILED_LIKE, TaskState
from .task import MapRef, TaskRef

#: "No value in memory" (a result may still be in the ledger).
UNSET: Any = object()
_SUCCEEDED = TaskState.SUCCEEDED.value
_PENDING = TaskState.PENDING.value
_FAILED_LIKE = frozenset(s.value for s in FAILED_LIKE)


class Instance:
    """One task of a run: a call node, or one child of a fan-out."""

    __slots__ = (
        "attempt",
        "dependents",
        "enc",
        "feeds",
        "fp",
        "group",
        "has_item",
        "hash",
        "item",
        "job",
        "key",
        "node",
        "pos",
        "ref",
        "state",
        "up",
        "used",
        "value",
        "waiting",
    )

    def __init__(self, key: str, node: Node, group: FanOut | None = None,
                 item: Any = UNSET) -> None:
        self.key = key
        self.node = node
        self.group = group
        self.item = item
        self.has_item = item is not UNSET
        self.pos: int | None = None
        self.state = ""
        self.attempt = 0
        self.used = 0
        self.waiting = 0
        # empty tuples until something is added: most tasks feed no fan-out, and a
        # list per task per field costs memory at 100,000 tasks
        self.dependents: list[Instance] | tuple[()] = ()
        self.feeds: list[FanOut] | tuple[()] = ()
        self.up: tuple[Instance | FanOut, ...] = ()
        self.value: Any = UNSET
        self.hash: str | None = None
        self.enc: Any = None
        self.ref: tuple[str, str | None, str | None] | None = None
        self.fp: str | None = None
        self.job: Any = None

    def __repr__(self) -> str:
        return f"<Instance {self.key} {self.state}>"


class FanOut:
    """A ``.map`` node at run time."""

    __slots__ = ("children", "dependents", "expanded", "failed", "feeds", "key", "left",
                 "node", "source")

    def __init__(self, node: Node, source: Instance | FanOut | None) -> None:
        self.key = node.key
        self.node = node
        self.source = source
        self.expanded = False
        self.failed = False
        self.children: list[Instance] = []
        self.left = 0
        self.dependents: list[Instance] | tuple[()] = ()
        self.feeds: list[FanOut] | tuple[()] = ()

    @property
    def done(self) -> bool:
        return self.expanded and self.left == 0 and not self.failed

    @property
    def hash(self) -> str:
        return ",".join(c.hash or "" for c in self.children)


Resolver = Callable[[Instance], Any]


class Plan:
    """Instances, groups and ready counts for one drive of a run."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.insts: dict[str, Instance] = {}
        self.groups: dict[str, FanOut] = {}
        self._lits: dict[str, bytes] = {}

    # -- building -----------------------------------------------------------------
    def instantiate(self) -> list[Instance]:
        """Create the call instances and groups; return new instances in order.

        Fan-outs over literal lists expand at once.
        """
        created: list[Instance] = []
        for node in self.graph.nodes.values():
            if node.is_map:
                src = node.source
                source: Instance | FanOut | None = None
                if isinstance(src, TaskRef):
                    source = self._node_at_run_time(src.key)
                elif isinstance(src, MapRef):
                    source = self.groups[src.key]
                g = FanOut(node, source)
                self.groups[node.key] = g
                if isinstance(source, Instance):
                    source.feeds = [*source.feeds, g]
                elif isinstance(source, FanOut):
                    source.feeds = [*source.feeds, g]
                    if source.expanded:   # over a literal list: already expanded above
                        created.extend(self._expand_elementwise(g, source))
                if source is None:
                    created.extend(self.expand(g, list(src)))
            else:
                inst = Instance(node.key, node)
                self.insts[node.key] = inst
                inst.up = tuple([self._node_at_run_time(k) for k in node.deps])
                created.append(inst)
        return created

    def _node_at_run_time(self, key: str) -> Instance | FanOut:
        inst = self.insts.get(key)
        return inst if inst is not None else self.groups[key]

    def link(self, inst: Instance) -> str | None:
        """Count what ``inst`` waits for; return a failed upstream key, if any."""
        node = inst.node
        if node.after:
            waits: Any = [*inst.up, *[self._node_at_run_time(k) for k in node.after]]
        else:
            waits = inst.up     # (most tasks: a fan-out's child waits for nothing at all)
        failed = None
        for w in waits:
            if isinstance(w, Instance):
                st = w.state
                if st == _SUCCEEDED:
                    continue
                if st in _FAILED_LIKE:
                    failed = w.key
                    continue
            elif w.done:
                continue
            elif w.failed:
                failed = w.key
                continue
            inst.waiting += 1
            deps = w.dependents
            if isinstance(deps, list):
                deps.append(inst)
            else:
                w.dependents = [inst]
        return failed

    def expand(self, g: FanOut, items: list[Any]) -> list[Instance]:
        """Create ``g``'s children (and element-wise downstream groups')."""
        node = g.node
        g.expanded = True
        created: list[Instance] = []
        bdeps = tuple([self._node_at_run_time(k) for k in node.deps])
        seen: dict[str, int] = {}
        for item in items:
            ik = item_key(item, node.item_key)
            n = seen.get(ik, 0)
            seen[ik] = n + 1
            if n:
                ik = f"{ik}~{n + 1}"
            child = Instance(f"{node.key}[{ik}]", node, g, item)
            child.up = bdeps
            created.append(child)
        created.extend(self._finish_expand(g, created))
        return created

    def _finish_expand(self, g: FanOut, children: list[Instance]) -> list[Instance]:
        g.children = children
        g.left = len(children)
        for i, c in enumerate(children):
            c.pos = i
            self.insts[c.key] = c
        more: list[Instance] = []
        for fg in g.feeds:
            more.extend(self._expand_elementwise(fg, g))
        return more

    def _expand_elementwise(self, g: FanOut, src: FanOut) -> list[Instance]:
        node = g.node
        g.expanded = True
        bdeps = tuple([self._node_at_run_time(k) for k in node.deps])
        children = []
        prefix = len(src.key)
        for sc in src.children:
            child = Instance(node.key + sc.key[prefix:], node, g, UNSET)
            child.up = (sc, *bdeps)
            children.append(child)
        return children + self._finish_expand(g, children)

    # -- progress -----------------------------------------------------------------
    def succeeded(self, inst: Instance, resolve: Resolver) -> tuple[list[Instance], list[Instance]]:
        """Record a committed success; return (now ready, newly created)."""
        ready: list[Instance] = []
        created: list[Instance] = []
        for d in inst.dependents:
            d.waiting -= 1
            if d.waiting == 0 and d.state == _PENDING:
                ready.append(d)
        inst.dependents = ()
        for fed in inst.feeds:
            value = resolve(inst)
            items = value if isinstance(value, list) else list(value)
            created.extend(self.expand(fed, items))
        if inst.feeds:
            ready.extend(self.empty_groups_done(created))
        g = inst.group
        if g is not None:
            g.left -= 1
            if g.left == 0 and not g.failed:
                ready.extend(self._group_done(g))
        return ready, created

    def _group_done(self, g: FanOut) -> list[Instance]:
        ready = []
        for d in g.dependents:
            d.waiting -= 1
            if d.waiting == 0 and d.state == _PENDING:
                ready.append(d)
        g.dependents = ()
        return ready

    def empty_groups_done(self, created: list[Instance]) -> list[Instance]:
        """Complete groups that expanded to zero children; return ready instances."""
        ready = []
        for g in self.groups.values():
            if g.expanded and not g.children and g.dependents:
                ready.extend(self._group_done(g))
        return ready

    def failed(self, inst: Instance) -> list[Instance]:
        """Return pending instances that can no longer run because ``inst`` did not succeed."""
        doomed: list[Instance] = []
        stack: list[Instance | FanOut] = [inst]
        while stack:
            thing = stack.pop()
            deps = thing.dependents
            thing.dependents = ()
            for d in deps:
                if d.state == _PENDING and d not in doomed:
                    doomed.append(d)
                    stack.append(d)
            for g in thing.feeds:
                if not g.expanded and not g.failed:
                    g.failed = True
                    stack.append(g)
            if isinstance(thing, Instance) and thing.group is not None and not thing.group.failed:
                thing.group.failed = True
                stack.append(thing.group)
        return doomed

    # -- arguments and fingerprints -----------------------------------------------------
    def literal_bytes(self, inst: Instance) -> bytes:
        """Deterministic bytes of the literal arguments (refs replaced by keys)."""
        node = inst.node
        lit = self._lits.get(node.key)
        if lit is None:
            if node.args and not node.kwargs and _simple_args(node.args):
                # the common call f(x, y) with refs and scalars: _fast_canon's text, built flat
                lit = ("[[" + ",".join([f"<ref {a.key}>" if type(a) is TaskRef else repr(a)
                                        for a in node.args]) + "],{}]").encode()
            elif node.args or node.kwargs:
                try:
                    lit = _fast_canon((node.args, node.kwargs)).encode()
                except TypeError:
                    lit = canonical([_keyed(node.args), _keyed(node.kwargs)])
            else:
                lit = b""
            if node.is_map:     # shared by every child; a call node asks once
                self._lits[node.key] = lit
        if inst.has_item:
            return lit + b"\x01" + canonical(inst.item)
        return lit

    def arguments(self, inst: Instance, resolve: Resolver) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments of ``inst`` with results filled in."""
        node = inst.node
        if node.is_map:
            first = inst.item if inst.has_item else resolve(inst.up[0])  # type: ignore[arg-type]
            kwargs = _fill(node.kwargs, self, resolve) if node.has_refs else node.kwargs
            return (first,), kwargs
        if not node.has_refs:
            return node.args, node.kwargs
        insts = self.insts
        args = tuple([resolve(insts[a.key]) if type(a) is TaskRef else _fill(a, self, resolve)
                      for a in node.args])
        return args, _fill(node.kwargs, self, resolve) if node.kwargs else node.kwargs

    def group_value(self, g: FanOut, resolve: Resolver) -> list[Any]:
        return [resolve(c) for c in g.children]


_REPR_TYPES = (str, int, float, bool, type(None))


def _simple_args(args: tuple[Any, ...]) -> bool:
    for a in args:
        t = type(a)
        if t is not TaskRef and t not in _REPR_TYPES:
            return False
    return True


def _fast_canon(value: Any) -> str:
    """A deterministic text for simple literals and references (TypeError otherwise)."""
    t = type(value)
    if t in _REPR_TYPES:
        return repr(value)
    if t is TaskRef or t is MapRef:
        return f"<ref {value.key}>"
    if t is tuple or t is list:
        return "[" + ",".join([_fast_canon(v) for v in value]) + "]"
    if t is dict:
        return "{" + ",".join([f"{k!r}:{_fast_canon(value[k])}" for k in sorted(value)]) + "}"
    raise TypeError(t.__name__)


def _keyed(value: Any) -> Any:
    t = type(value)
    if t is TaskRef or t is MapRef:
        return {"$ref": value.key}
    if t is list or t is tuple:
        return [_keyed(v) for v in value]
    if t is dict:
        return {k: _keyed(v) for k, v in value.items()}
    return value


def _fill(value: Any, plan: Plan, resolve: Resolver) -> Any:
    t = type(value)
    if t is TaskRef:
        return resolve(plan.insts[value.key])
    if t is MapRef:
        return plan.group_value(plan.groups[value.key], resolve)
    if t is list:
        return [_fill(v, plan, resolve) for v in value]
    if t is tuple:
        return tuple([_fill(v, plan, resolve) for v in value])
    if t is dict:
        return {k: _fill(v, plan, resolve) for k, v in value.items()}
    return value


def resolver(plan: Plan, read_blob: Callable[[str, str | None, str | None], Any],
             unread: Callable[[list[Instance]], bool] | None = None) -> Resolver:
    """The function that gives a task's (or a fan-out's) result value to its dependents:
    kept in memory, decoded from what the attempt reported, or read from the store
    (``unread``: reads the row of a success a frontier resume restored without it)."""
    from .errors import PipelineError
    from .results import decode

    def resolve(thing: Any) -> Any:
        if not isinstance(thing, Instance):
            return plan.group_value(thing, resolve)
        if thing.value is not UNSET:
            return thing.value
        if thing.enc is not None:
            value = decode(thing.enc.kind, thing.enc.data)
        elif thing.ref is not None:
            kind, data, uri = thing.ref
            value = read_blob(kind, data, uri)
        elif unread is not None and unread([thing]):
            return resolve(thing)
        else:
            raise PipelineError(f"result of task {thing.key!r} is not available",
                                hint="resume the run so the task runs again")
        thing.value = value
        return value
    return resolve
