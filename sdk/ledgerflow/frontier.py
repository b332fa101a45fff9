"""A frontier resume: the successes a resume keeps, restored before their rows are read.

A resume of a big run with few tasks left should cost what is left, not the run.
When the store offers a frontier read (:func:`ledgerflow.store.frontier`), the
resume reads the rows of the tasks it may change and only the *keys* of the
successes it keeps (``RunView.settled``). The runner restores each kept success
as ``succeeded`` at once, and :class:`Unread` reads the rows of those whose
result or hash a task about to run needs (its direct upstreams, a fan-out's
source or children): those the graph names are read with the frontier
(:func:`read_upstreams`), the others in one read per batch of ready tasks. The
rest are never read: a 10,000-task run with one task left reads one row and
its upstream's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from .graph import Graph
from .plan import FanOut, Instance
from .states import TaskState
from .store import task_rows
from .task import TaskRef
from .views import RunView, TaskRow

_SUCCEEDED = TaskState.SUCCEEDED.value


class Unread:
    """The kept successes of a frontier read whose rows are not read yet."""

    __slots__ = ("fetch", "insts", "keys", "restore")

    def __init__(self, keys: frozenset[str], fetch: Callable[[list[str]], dict[str, TaskRow]],
                 restore: Callable[[Instance, TaskRow], None]) -> None:
        self.keys = keys
        self.fetch = fetch          # keys -> their rows, in one read
        self.restore = restore      # what the runner does with a prior row
        #: restored as succeeded, row not read yet, by key
        self.insts: dict[str, Instance] = {}

    def adopt(self, inst: Instance) -> bool:
        """Restore ``inst`` as a kept success if the frontier read left its row out."""
        if inst.key not in self.keys:
            return False
        inst.state = _SUCCEEDED
        self.insts[inst.key] = inst
        return True

    def _unread(self, things: Iterable[Instance | FanOut]) -> list[str]:
        """The keys of the unread successes among ``things`` (a fan-out: its children)."""
        pending = self.insts
        need: list[str] = []
        for t in things:
            if type(t) is FanOut:
                need += [c.key for c in t.children if c.key in pending]
            elif t.key in pending:
                need.append(t.key)
        return need

    def fill(self, things: Iterable[Instance | FanOut]) -> bool:
        """Read the rows of the unread successes among ``things`` (a fan-out: its
        children) and restore them; True if any was read."""
        need = self._unread(things)
        if not need:
            return False
        pending = self.insts
        rows = self.fetch(sorted(set(need)))
        for key, row in rows.items():
            inst = pending.pop(key, None)
            if inst is not None:
                self.restore(inst, row)
        return bool(rows)

    def fill_for(self, inst: Instance, ready: Iterable[Instance]) -> None:
        """Before ``inst`` runs: if it needs an unread row, read what it and the other
        ready tasks need, in one read (the ready tasks are scanned only then, so a
        dispatch whose upstreams are all read costs a look at its own)."""
        if self._unread(inst.up):
            self.fill([u for i in (inst, *ready) for u in i.up])


def unread_of(prior: RunView | None, store: object,
              restore: Callable[[Instance, TaskRow], None]) -> Unread | None:
    """The unread successes of ``prior`` if it came from a frontier read, else None."""
    if prior is None or not prior.settled:
        return None
    return Unread(prior.settled, partial(task_rows, store, prior.run_id), restore)


def read_upstreams(view: RunView, graph: Graph, store: object) -> None:
    """Move into ``view.tasks`` the kept successes the tasks left need at once: the
    upstreams of the tasks the frontier read holds, and the sources of fan-outs
    (expanding one needs its list). One read, on the caller's connection; what is
    found needed later (a fan-out's children) :class:`Unread` reads."""
    kept = view.settled
    if not kept:
        return
    nodes = graph.nodes
    want: set[str] = set()
    for key, row in view.tasks.items():
        node = nodes.get(row.node or key)
        if node is not None:
            want.update(d for d in node.deps if d in kept)
    for node in nodes.values():
        if node.is_map and type(node.source) is TaskRef and node.source.key in kept:
            want.add(node.source.key)
    if want:
        rows = task_rows(store, view.run_id, sorted(want))
        view.tasks.update(rows)
        view.settled = kept.difference(rows)
