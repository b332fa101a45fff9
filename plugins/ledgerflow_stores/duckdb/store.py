"""The ``duckdb`` store: the ledger as one DuckDB file plus per-run journals.

DuckDB lets one process hold a file read-write and then no other process can
open it at all, and a statement per transition costs ~0.5 ms. So the driver
never keeps the file open: it appends each group commit as one line to a
per-run journal (:mod:`.journal`; that append is the durability point) and
folds journals into the tables in set-based batches (:mod:`.fold`), opening
the file only for the fold: a background thread folds while the run goes
on, and the tail is folded at release, behind the run's return
(:mod:`.behind`). Readers in any process open the file read-only for a
moment and add the unfolded journal tail
(:func:`ledgerflow.projection.apply`), so ``status``, ``runs`` and ``cancel``
work while a run is active. Leases and cancel requests are files
(:mod:`.lease`), large results content-addressed files (:mod:`ledgerflow.blobs`); the reads are
:class:`ledgerflow.ledger.RecordReads` over this store's primitives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ledgerflow.blobs import Blobs
from ledgerflow.errors import (
    DamagedLedgerError,
    JournalDamagedError,
    LeaseLostError,
    NotResumableError,
    RunNotFoundError,
    StoreError,
)
from ledgerflow.ledger import RecordReads, matching
from ledgerflow.projection import apply
from ledgerflow.records import RUN_KINDS, AnyRecord, Record, RunDefined, Takeover
from ledgerflow.states import RUN_ACTIVE, RunState, TaskState
from ledgerflow.store import CacheHit, Lease
from ledgerflow.views import RunView, TaskRow

from . import behind, doctor, queries, summary
from .connection import Ledger
from .decisions import Decisions
from .fold import BackgroundFold, Fold, FoldPolicy, stale_notice
from .folding import Folding
from .journal import Journals, TailReads
from .lease import Heartbeat, Leases

log = logging.getLogger("ledgerflow")
R = TypeVar("R", bound=Record)
T = TypeVar("T")
_ACTIVE = frozenset(s.value for s in RUN_ACTIVE)


class DuckDBStore(Folding, RecordReads):
    """The default ledger (see the module docstring for the design).

    Args:
        path: the DuckDB file; its side folder is ``PATH.d``.
        sync: ``normal`` (a commit survives a crash of the process) or ``full``
            (also ``fsync``: survives a power loss); default ``LEDGERFLOW_SYNC``.
        lock_timeout: seconds to wait for another process's lock on the file.
        policy: fold batch sizes and timing.
    """

    name = "duckdb"

    def __init__(self, path: str, *, sync: str | None = None,
                 lock_timeout: float | None = None, policy: FoldPolicy | None = None) -> None:
        p = Path(path).expanduser()
        if p.is_dir():
            raise StoreError(f"ledger path is a directory: {path}",
                             hint="pass --store DIR/ledger.duckdb")
        self.location = str(p.resolve())
        self.side = Path(self.location + ".d")
        self.policy = policy or FoldPolicy.from_env()
        self.ledger = Ledger(self.location, lock_timeout if lock_timeout is not None else float(
            os.environ.get("LEDGERFLOW_LOCK_TIMEOUT", "30")), heal=self._heal)
        self.journals = Journals(self.side / "journals",
                                 (sync or os.environ.get("LEDGERFLOW_SYNC", "normal")).lower())
        self.leases = Leases(self.side / "runs")
        self.decisions = Decisions(self.side / "runs")
        self.blobs = Blobs(self.side, inline_limit=2048,
                           missing_hint="pipeline resume RUN_ID runs the task that made it "
                           "again; pipeline doctor lists missing files")
        self.folds = Fold(self.journals, self.side / "tmp", self.policy)
        self._beats: dict[str, Heartbeat] = {}
        self._background: dict[str, BackgroundFold] = {}
        #: run -> the driver token this process last read it at (see :meth:`take_over`)
        self._seen: dict[str, int] = {}
        self.tails = TailReads()

    # -- writing -------------------------------------------------------------------------
    def create_run(self, run_id: str, records: Sequence[Record]) -> Lease:
        if self.ledger.exists() and self.ledger.version is None:
            with self.ledger.connect(False):     # refuse a damaged or newer ledger first
                pass
        try:
            self._lease(run_id, 1)
        except OSError as exc:
            raise StoreError(f"cannot write the ledger's folder {self.side}: {exc.strerror}",
                             hint="make it writable, or pass --store PATH in a writable "
                             "folder") from None
        lease = Lease(run_id, 1)
        self._seen[run_id] = 1
        self.append(lease, records)
        return lease

    def _lease(self, run_id: str, token: int) -> None:
        self.leases.write(run_id, token)
        self.journals.start(run_id, token)
        self._beats[run_id] = Heartbeat(self.leases, run_id, token,
                                        lambda: self.journals.newest_token(run_id))
        self._background[run_id] = BackgroundFold(self._fold_bite, run_id, self.policy)

    def take_over(self, run_id: str) -> Lease:
        """Lease ``run_id`` for this process (see the protocol). The write lock on the
        file makes takeovers one at a time; one based on a read of this process that
        another driver has made stale (it took the run over since, or drove it at the
        time) is refused, so two resumes started at once never both drive the run; so is
        one of a run that succeeded, whoever read it (a read from another store object)."""
        self._folded_behind(run_id)     # this process's release of it, done
        with self.ledger.connect(True) as con:
            self.folds.run(con, run_id)
            row = con.execute("SELECT token, state FROM runs WHERE run_id = ?",
                              [run_id]).fetchall()
            if not row:
                raise RunNotFoundError(f"no run {run_id!r} in {self.location}")
            if self.driver_alive(run_id):
                lease = self.leases.read(run_id) or {}
                raise NotResumableError(
                    f"run {run_id} is still being driven by pid {lease.get('pid')} on "
                    f"{lease.get('host')}",
                    hint=f"wait for it, or stop it first: pipeline cancel {run_id}")
            seen = self._seen.get(run_id)
            if seen is not None and (row[0][0] or 0) > seen:
                raise _resumed_meanwhile(con, run_id)
            if row[0][1] == RunState.SUCCEEDED.value:   # whatever the caller read before
                raise NotResumableError(f"run {run_id} already succeeded; nothing to resume",
                                        hint=f"see it with: pipeline status {run_id}")
            seg_tokens = [t for t, _ in self.journals.segments(run_id)]
            previous = max([row[0][0] or 0, *seg_tokens])
            token = previous + 1
            folded = queries.folded_offsets(con, run_id)
            con.execute("UPDATE runs SET token = ? WHERE run_id = ?", [token, run_id])
            self.leases.clear_cancel(run_id)
            self._lease(run_id, token)
            self._seen[run_id] = token
            # where the old driver's segment ends for good (what repair folds up to)
            self.journals.append(run_id, [Takeover(previous, folded.get(previous, 0),
                                                   time.time())])
        return Lease(run_id, token)

    def append(self, lease: Lease, records: Sequence[Record]) -> None:
        if not records:
            return
        beat = self._beats.get(lease.run_id)
        if self.journals.token(lease.run_id) != lease.token or (
                beat is not None and beat.fenced):
            raise LeaseLostError(f"run {lease.run_id} was taken over by another driver; "
                                 f"token {lease.token} is no longer valid")
        n = self.journals.append(lease.run_id, records)
        background = self._background.get(lease.run_id)
        if background is not None:
            background.wrote(n)

    def release(self, lease: Lease) -> None:
        background = self._background.pop(lease.run_id, None)
        if background is not None:
            background.stop()
        beat = self._beats.pop(lease.run_id, None)
        if beat is not None:
            beat.stop()
        if not self.journals.stop(lease.run_id):
            return
        if beat is not None and beat.fenced:
            return
        if not self.policy.fold_at_release:
            self.leases.remove(lease.run_id, lease.token)
        elif self.policy.behind and not self.ledger.held() and self.ledger.exists():
            # the run is durable: its tables catch up behind it (not from within a read
            # block of this thread, which holds the file the fold needs: folded here;
            # nor the first run of a new ledger, whose file is made here: one made
            # behind could land in a folder the caller removes as the run returns)
            behind.start(self.location, lease.run_id,
                         lambda: self._fold_released(lease, behind=True))
        else:
            self._fold_released(lease)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """One read connection for every read of this thread in the block (see
        :meth:`Ledger.reading`), and each journal tail decoded once (:class:`TailReads`)."""
        with self.ledger.reading(), self.tails.block():
            yield

    def doctor(self) -> list[dict[str, Any]]:
        """What is wrong with this ledger, in plain words (see :mod:`.doctor`)."""
        return [f.as_json() for f in doctor.examine(self)]

    def repair(self) -> tuple[str, list[str]]:
        """Rebuild the tables from the journals; return where the old file is kept and
        what was cut."""
        self.settle()
        return doctor.rebuild(self)

    def _heal(self, killed: list[int]) -> None:
        """Rebuild a file that a writer killed in its checkpoint left torn (see
        :mod:`.writers`): what it held is in the journals."""
        kept, notes = doctor.rebuild(self)
        log.warning("ledger %s was damaged by a process killed while it wrote the file "
                    "(pid %s); rebuilt from the journals (the damaged file is kept at %s)",
                    self.location, ", ".join(map(str, killed)), kept)
        for note in notes:
            log.warning("%s", note)

    # -- reading -------------------------------------------------------------------------
    def _tail(self, con: Any, run_id: str, *, damage_too: bool = True
              ) -> tuple[list[AnyRecord], list[str]]:
        """The records of ``run_id`` not folded yet (a superseded driver's are left out),
        and what is damaged (folded damage included; ``damage_too=False``: only what the
        tail needs, none for a folded run)."""
        segs = self.journals.segments(run_id)
        if not segs:
            return [], queries.damage(con, run_id) if damage_too else []
        damage = queries.damage(con, run_id)
        folded = queries.folded_offsets(con, run_id)
        current = max(t for t, _ in segs)
        records: list[AnyRecord] = []
        for token, path in segs:
            if token < current and token in folded:
                # what an old driver wrote after the takeover is not applied, but told
                stale, _ = self.tails.read(path, folded[token])
                if stale:
                    records.append(stale_notice(token, len(stale), path))
                continue
            if any(d.startswith(f"journal {path.name} ") for d in damage):
                continue  # used up to its damage by the fold already
            more, bad = self.tails.read(path, folded.get(token, 0))
            records.extend(more)
            if bad is not None:
                damage.append(bad.describe())
        return records, damage

    def get_run(self, run_id: str, *, tasks: bool = True, upstream: bool = True) -> RunView:
        with self.ledger.connect(False) as con:
            view = queries.load_run(con, run_id, tasks=tasks, upstream=upstream)
            tail, damage = self._tail(con, run_id)
        return self._view(run_id, view, tail, damage, tasks)

    def _view(self, run_id: str, view: RunView | None, tail: list[AnyRecord],
              damage: list[str], tasks: bool = True) -> RunView:
        if not tasks:
            tail = [r for r in tail if isinstance(r, RUN_KINDS)]
        if view is None:
            if not any(isinstance(r, RunDefined) for r in tail):
                if self.journals.archived(run_id):
                    raise DamagedLedgerError(
                        f"run {run_id} is in its journal but not in the ledger's tables",
                        hint="pipeline repair rebuilds the tables from the journals")
                if damage:
                    raise JournalDamagedError(
                        f"run {run_id} cannot be read: {damage[0]}",
                        hint="pipeline doctor explains it; pipeline repair rebuilds the ledger")
                raise RunNotFoundError(f"no run {run_id!r} in {self.location}")
            view = RunView(run_id)
        apply(view, tail)
        view.damage = "; ".join(damage) or None
        view.driver_alive = self._alive(view)
        self._saw(view)
        return view

    def _alive(self, view: RunView) -> bool:
        """True if a driver is alive for ``view``'s run (asked only of an active run)."""
        return view.state in _ACTIVE and self.driver_alive(view.run_id)

    def _saw(self, view: RunView) -> None:
        """Note the token ``view`` was read at: a read while a driver went on is no
        ground for a takeover (see :meth:`take_over`)."""
        self._seen[view.run_id] = -1 if view.driver_alive else view.token

    def summarize(self, run_id: str, *, min_tasks: int = 500) -> RunView | None:
        """The run with its tasks summed per name and no task rows (see
        :mod:`.summary`), for a big run, its journal tail applied (a live run); None
        when only a full read answers right (few tasks, a run the tables do not hold
        yet, damage, approvals waiting: their decisions are overlaid on the rows)."""
        segs = self.journals.segments(run_id)
        with self.ledger.connect(False) as con:
            view = queries.load_run(con, run_id, tasks=False)
            if view is None or queries.damage(con, run_id):
                return None
            tail: list[AnyRecord] = []
            if segs and not _all_folded(queries.folded_offsets(con, run_id), segs):
                tail, damage = self._tail(con, run_id)
                if damage:
                    return None
            summed = summary.summarize(con, view, min_tasks, tail)
        if summed is None or (summed.task_counts or {}).get(TaskState.WAITING_APPROVAL.value):
            return None
        summed.driver_alive = self._alive(summed)
        return summed

    def unsettled(self, run_id: str) -> tuple[RunView, int] | None:
        """The run with the rows of only those tasks a resume may change, and how many
        it leaves out: the successes whose result is in their row, which a resume
        keeps (``resume --plan`` of a big run). None when only a full read answers
        right (a journal not folded yet, damage, a run the tables do not hold)."""
        self._folded_behind(run_id)     # (its release's fold)
        def count_settled(con: Any, view: RunView) -> tuple[RunView, int]:
            return view, int(con.execute(f"SELECT count(*) FROM tasks WHERE run_id = ? "
                                         f"AND {queries.SETTLED}", [run_id]).fetchone()[0])
        return self._from_tables(run_id, count_settled, upstream=False, unsettled=True)

    def frontier(self, run_id: str) -> RunView | None:
        """The run as a resume first reads it: the rows of the tasks it may change, and
        only the keys of the successes it keeps (``RunView.settled``; their rows are
        read by :meth:`task_rows` when a task that runs needs them). None when only a
        full read answers right."""
        self._folded_behind(run_id)     # (its release's fold)
        def keys(con: Any, view: RunView) -> RunView:
            view.settled = queries.settled_keys(con, run_id)
            view.signals = queries.has_signals(con, run_id)
            return view
        view = self._from_tables(run_id, keys, upstream=False, unsettled=True)
        if view is not None:    # a read for a takeover, as get_run's
            self._saw(view)
        return view

    def task_rows(self, run_id: str, keys: list[str]) -> dict[str, TaskRow]:
        """The folded rows of the run's tasks ``keys`` (a frontier resume's successes)."""
        with self.ledger.connect(False) as con:
            return queries.task_rows(con, run_id, keys)

    def _from_tables(self, run_id: str, read: Callable[[Any, RunView], T | None],
                     **load: bool) -> T | None:
        """``read(con, view)`` of a run the tables hold whole (its journal all folded,
        nothing damaged), ``view`` loaded with ``load`` and told whether its driver
        lives; None when only a full read (tables and journal tail) answers right."""
        segs = self.journals.segments(run_id)
        with self.ledger.connect(False) as con:
            if segs and not _all_folded(queries.folded_offsets(con, run_id), segs):
                return None     # a tail the tables lack (a live run, or one not recovered)
            view = queries.load_run(con, run_id, **load)
            if view is None or queries.damage(con, run_id):
                return None
            out = read(con, view)
        if out is not None:
            view.driver_alive = self._alive(view)
        return out

    def list_runs(self, limit: int = 50) -> list[RunView]:
        with self.ledger.connect(False) as con:
            views = queries.list_runs(con, limit)
        for rid in self.journals.runs():
            try:
                views[rid] = self.get_run(rid)
            except (RunNotFoundError, JournalDamagedError):
                continue    # a journal too damaged to name its run: doctor reports it
        out = sorted(views.values(), key=lambda v: v.created_at, reverse=True)[:limit]
        for v in out:
            if v.state in _ACTIVE and v.driver_alive is None:
                v.driver_alive = self.driver_alive(v.run_id)
        return out

    def request_cancel(self, run_id: str) -> None:
        self.get_run(run_id, tasks=False)
        self.leases.request_cancel(run_id)

    def cancel_requested(self, run_id: str) -> bool:
        return self.leases.cancel_requested(run_id)

    # -- the shared read side's primitives (see :class:`ledgerflow.ledger.RecordReads`) ---
    def _cache_read(self, names: list[str], exclude_run: str | None,
                    limit: int | None) -> dict[str, CacheHit] | set[str]:
        # the index is the tables': what this process's runs left behind goes in first
        self._folded_behind()
        with self.ledger.connect(False) as con:
            return queries.CACHED.read(con, names, exclude_run, limit)

    def _kind_rows(self, run_id: str, kind: type[R], *, task_key: str | None = None,
                   attempt: int | None = None) -> list[R]:
        """Every record of ``kind`` of a run: folded rows, then the journal tail."""
        with self.ledger.connect(False) as con:
            known = queries.has_run(con, run_id)
            rows: list[R] = queries.record_rows(con, run_id, kind, task_key=task_key,
                                                attempt=attempt) if known else []
            tail, _ = self._tail(con, run_id, damage_too=False)
        if not known and not any(isinstance(r, RunDefined) for r in tail):
            raise RunNotFoundError(f"no run {run_id!r} in {self.location}")
        return rows + matching(tail, kind, task_key, attempt)

    def _side_decisions(self, run_id: str) -> list[dict[str, Any]]:
        return self.decisions.all(run_id)

    # -- approvals and steps -----------------------------------------------------------
    def decide(self, run_id: str, task_key: str, digest: str, decision: str, by: str,
               reason: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record a decision on a request from any process; the first one wins
        (ApprovalConflictError for the others)."""
        self.get_run(run_id, tasks=False)
        return self.decisions.write(run_id, {
            "task_key": task_key, "digest": digest, "decision": decision,
            "decided_by": by, "reason": reason, "decided_at": time.time(),
            **({} if arguments is None else {"arguments": arguments})})

    def worker_folders(self, run_id: str) -> tuple[str, str]:
        """(the ledger's side folder, this run's folder): where workers on this machine
        keep durable files (step logs, budgets, rate limits)."""
        return str(self.side), str(self.leases.run_dir(run_id))

    def driver_alive(self, run_id: str) -> bool:
        """True if a live process drives ``run_id``: its lease names one, or one holds
        the lock on a journal segment (liveness does not rest on one file)."""
        return self.leases.alive(run_id) or self.journals.held(run_id)

    def close(self) -> None:
        for run_id, token in self.journals.open_runs():
            self.release(Lease(run_id, token))


def _resumed_meanwhile(con: Any, run_id: str) -> NotResumableError:
    """The refusal of a takeover of a run another process took over (and maybe finished)
    since this one read it: the read is stale, so the run is not driven from it."""
    pid, state = con.execute("SELECT driver_pid, state FROM runs WHERE run_id = ?",
                             [run_id]).fetchone()
    return NotResumableError(
        f"run {run_id} is being resumed by pid {pid} (or was, since this resume read it: "
        f"it is {state} now)", hint=f"see it with: pipeline status {run_id}")


def _all_folded(folded: dict[int, int], segs: list[tuple[int, Path]]) -> bool:
    """True if every live segment is folded to its end (a crashed run once recovered)."""
    try:
        return all(folded.get(token) == path.stat().st_size for token, path in segs)
    except OSError:     # archived meanwhile: the caller reads it whole
        return False
