"""The PostgreSQL store's fold: committed, unfolded commits into the tables.

The driver keeps the current state of each run it drives in memory (a
:class:`Mirror`: a :class:`~ledgerflow.views.RunView` loaded at creation or
takeover, with :func:`ledgerflow.projection.apply` of every commit applied by
:func:`project`), and :class:`Folder` upserts the rows those commits touched,
as of the last one, in one fenced statement per fold (a compare-and-set on
the run's fold position, so nothing is folded twice). A background thread
folds every :data:`FOLD_INTERVAL` seconds or once :data:`FOLD_RECORDS` wait;
:meth:`Folder.recover` folds what gone drivers left and :meth:`Folder.rebuild`
rebuilds a run's rows from all its commits (``pipeline repair``). The folder
receives the store's :class:`~.connection.Connections`; it does not reach back
into the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from ledgerflow.errors import RunNotFoundError, StoreError
from ledgerflow.projection import apply
from ledgerflow.records import (
    KINDS,
    AttemptEnded,
    Record,
    ResultRecorded,
    TaskCreated,
    Transition,
)
from ledgerflow.views import RunView, TaskRow

from . import queries
from .connection import Connections, is_connection_error
from .sql import RUN_FIELDS, fold_params, run_tuple

log = logging.getLogger("ledgerflow")
_ROW_KINDS = (Transition, TaskCreated, AttemptEnded, ResultRecorded)

#: A fold runs at least this often while a run has unfolded commits (seconds) ...
FOLD_INTERVAL = 0.5
#: ... and at once when this many records wait.
FOLD_RECORDS = 4096


@dataclass(slots=True)
class Mirror:
    """A run this store drives: its committed state, and what is not folded yet."""

    token: int
    view: RunView
    seq: int = 0                    # the last group commit's sequence under ``token``
    next_ord: int = 0               # creation order of the next new task
    folded: tuple[int, int] = (0, 0)        # commits folded up to (token, seq)
    pending: dict[str, TaskRow] = field(default_factory=dict)   # rows as of ``seq``
    ords: dict[str, int] = field(default_factory=dict)          # new tasks' orders
    run_changed: bool = False
    records: int = 0                # records committed and not folded
    unsure: bool = False            # a fold's outcome is unknown (lost connection)


_task_fields = attrgetter(*TaskRow.__dataclass_fields__)
_run_fields = attrgetter(*RUN_FIELDS)


def clone_view(view: RunView) -> RunView:
    """A RunView with ``view``'s own row and no tasks (copy.copy is several times slower)."""
    return RunView(**dict(zip(RUN_FIELDS, _run_fields(view), strict=True)))


def project(mirror: Mirror, records: Sequence[Record]
            ) -> tuple[RunView, list[tuple[TaskRow, int]], bool, int]:
    """The rows ``records`` touch, after them (the mirror is not changed)."""
    base = mirror.view
    scratch = clone_view(base)
    for rec in records:
        if type(rec) in _ROW_KINDS:
            key = rec.task_key  # type: ignore[attr-defined]
            if key not in scratch.tasks:
                old = base.tasks.get(key)
                if old is not None:
                    scratch.tasks[key] = TaskRow(*_task_fields(old))
    apply(scratch, records)
    ord_ = mirror.next_ord
    rows: list[tuple[TaskRow, int]] = []
    for key, row in scratch.tasks.items():
        if key in base.tasks:
            rows.append((row, -1))      # the upsert keeps its creation order
        else:
            rows.append((row, ord_))
            ord_ += 1
    return scratch, rows, run_tuple(scratch) != run_tuple(base), ord_


def commit_mirror(mirror: Mirror, scratch: RunView, seq: int, next_ord: int) -> None:
    """Make a landed commit's rows (``scratch``) the mirror's state."""
    mirror.view.tasks.update(scratch.tasks)
    for f in RUN_FIELDS:
        setattr(mirror.view, f, getattr(scratch, f))
    mirror.seq = seq
    mirror.next_ord = next_ord


def stage_tail(mirror: Mirror, tail: list[Any], in_tables: set[str]) -> None:
    """Make a loaded tail the mirror's pending fold (rows as of its last commit)."""
    view = mirror.view
    touched = {r.task_key for _, _, rs in tail for r in rs
               if type(r) in _ROW_KINDS}
    mirror.pending = {k: view.tasks[k] for k in touched}
    for k in view.tasks:        # the tail's new tasks, in creation order
        if k in touched and k not in in_tables:
            mirror.ords[k] = mirror.next_ord
            mirror.next_ord += 1
    mirror.run_changed = True
    mirror.records = sum(len(rs) for _, _, rs in tail)


class Folder:
    """Folds the store's mirrors (and what gone drivers left) into the tables.

    Args:
        conns: the store's connections (folds use the fold connection).
        mirrors: the runs the store drives, by run id (guarded by ``conns.wlock``).
        fenced: ``fenced(run_id, token, what)`` marks a lease lost (a fold refused).
    """

    def __init__(self, conns: Connections, mirrors: dict[str, Mirror],
                 fenced: Callable[[str, int, str], None]) -> None:
        self.conns = conns
        self.mirrors = mirrors
        self.fenced = fenced
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Fold now rather than at the next interval (many records wait)."""
        self._wake.set()

    def fold(self, mirror: Mirror, *, end: tuple[int, int] | None = None,
             wait: bool = True) -> bool:
        """Fold ``mirror``'s committed, unfolded commits into the tables (one statement).

        Returns False if the lease is not this driver's any more (nothing written).
        ``wait=False``: one try (connection errors leave the commits for later).
        A fold whose outcome was lost with the connection is checked first: the
        fold position says whether it landed (the statement is a compare-and-set
        on it), so nothing is folded twice.
        """
        run_id = mirror.view.run_id
        with self.conns.flock:
            with self.conns.wlock:
                if not mirror.records and end is None and not mirror.unsure:
                    return True
                start, stop = mirror.folded, end or (mirror.token, mirror.seq)
                rows = [(row, mirror.ords.get(key, -1)) for key, row in mirror.pending.items()]
                run = clone_view(mirror.view) if mirror.run_changed else None
                taken = (mirror.pending, mirror.ords, mirror.run_changed, mirror.records)
                mirror.pending, mirror.ords, mirror.run_changed, mirror.records = (
                    {}, {}, False, 0)

            def attempt(retry: bool) -> bool:
                con = self.conns.folder()
                begin = start
                if retry or mirror.unsure:
                    pos = queries.folded_to(con, run_id)
                    if pos == stop:
                        return True     # it landed before the connection broke
                    begin = max(begin, pos)     # an earlier fold of a part landed
                sql, params = fold_params(run_id, mirror.token, begin, stop, rows, run)
                row = con.execute(sql, params).fetchone()
                if row and row[0]:
                    return True
                # not applied: the lease is not this driver's (or it landed after all)
                return bool(queries.folded_to(con, run_id) == stop)

            try:
                if wait:
                    ok = self.conns.db.retrying(attempt, what=f"folding run {run_id}",
                                                reset=self.conns.reset_folder)
                else:
                    ok = attempt(False)
            except Exception as exc:
                with self.conns.wlock:       # not folded: keep it for the next fold
                    mirror.pending = {**taken[0], **mirror.pending}
                    mirror.ords = {**taken[1], **mirror.ords}
                    mirror.run_changed = mirror.run_changed or taken[2]
                    mirror.records += taken[3]
                if is_connection_error(exc):
                    self.conns.reset_folder()
                    mirror.unsure = True    # the next fold checks whether this one landed
                    return True
                raise
            mirror.unsure = False
            if not ok:
                self.fenced(run_id, mirror.token, "it stopped")
                return False
            mirror.folded = stop
            return True

    def start(self) -> None:
        """Start the background fold thread unless it runs (it ends with no mirror)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="ledgerflow-pg-fold")
            self._thread.start()

    def _loop(self) -> None:
        """Fold every held run's commits every FOLD_INTERVAL (sooner when many wait)."""
        while True:
            self._wake.wait(FOLD_INTERVAL)
            self._wake.clear()
            with self.conns.wlock:
                mirrors = [m for m in self.mirrors.values() if m.records]
                if not self.mirrors:
                    self._thread = None
                    return
            for m in mirrors:
                try:
                    self.fold(m, wait=False)
                except Exception:   # the fold at release reports what is still wrong
                    log.warning("ledgerflow: background fold of run %s failed",
                                m.view.run_id, exc_info=True)

    @staticmethod
    def dead_tails(con: Any) -> list[tuple[str, int]]:
        """Runs whose driver is gone (lease expired) with commits not folded yet."""
        return [(r, int(t)) for r, t in con.execute(
            "SELECT l.run_id, l.token FROM leases l JOIN folds f USING (run_id) "
            "WHERE l.expires_at <= now() AND EXISTS (SELECT 1 FROM commits c "
            "WHERE c.run_id = l.run_id AND (c.run_id, c.token, c.seq) > "
            "(f.run_id, f.token, f.seq))").fetchall()]

    def recover(self) -> list[str]:
        """Fold what drivers that are gone left unfolded; the runs folded."""
        done = []
        for run_id, token in self.conns.read(self.dead_tails, "reading the ledger"):
            with self.conns.wlock:
                if run_id in self.mirrors:
                    continue
            try:
                if self.fold_tail(run_id, token):
                    done.append(run_id)
            except RunNotFoundError:
                continue
        return done

    def fold_tail(self, run_id: str, token: int) -> bool:
        """Fold a run's unfolded commits under its current (expired) lease token."""
        def load(con: Any) -> tuple[RunView, set[str], int, tuple[int, int], list[Any]]:
            got = queries.load_run(con, run_id)
            if got is None:
                raise RunNotFoundError(f"no run {run_id!r} in {self.conns.db.shown}")
            view = got[0]
            in_tables = set(view.tasks)
            tail = queries.tail(con, run_id)
            for _, _, rs in tail:
                apply(view, rs)
            return (view, in_tables, queries.next_ord(con, run_id),
                    queries.folded_to(con, run_id), tail)
        view, in_tables, next_ord, folded, tail = self.conns.read(
            load, f"loading run {run_id}")
        if not tail:
            return False
        mirror = Mirror(token, view, 0, next_ord, folded)
        stage_tail(mirror, tail, in_tables)
        return self.fold(mirror, end=(tail[-1][0], tail[-1][1]), wait=False)

    def rebuild(self, run_id: str, token: int) -> None:
        """Rebuild ``run_id``'s rows from all its commits, in place (``repair``)."""
        def attempt(retry: bool) -> None:
            con = self.conns.folder()
            with con.transaction():
                if con.execute("SELECT 1 FROM leases WHERE run_id = %s AND token = %s "
                               "AND expires_at <= now() FOR UPDATE",
                               [run_id, token]).fetchone() is None:
                    raise StoreError(f"run {run_id} was taken over during the repair",
                                     hint="run pipeline repair again once it ended")
                commits = queries.tail_from(con, run_id, (0, 0))
                view = RunView(run_id)
                for _, _, rs in commits:
                    apply(view, rs)
                for table in ("tasks", *sorted({k.TABLE for k in KINDS.values()
                                                if k.TABLE})):
                    con.execute(f"DELETE FROM {table} WHERE run_id = %s", [run_id])
                con.execute("UPDATE folds SET token = 0, seq = 0 WHERE run_id = %s", [run_id])
                if not commits:
                    return
                end = (commits[-1][0], commits[-1][1])
                rows = [(row, i) for i, row in enumerate(view.tasks.values())]
                sql, params = fold_params(run_id, token, (0, 0), end, rows, view)
                con.execute(sql, params)
        with self.conns.flock:
            self.conns.db.retrying(attempt, what=f"repairing run {run_id}",
                                   reset=self.conns.reset_folder)
