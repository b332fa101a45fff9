"""The ``postgres`` store: one ledger in a PostgreSQL database shared by many machines.

Writing: a journal and a fold, as in the DuckDB store, with the database as
the journal. A group commit is one small statement (:mod:`.sql`): it checks
the run's lease token under a share lock on the lease row and inserts one
``commits`` row keyed by ``(run, token, seq)`` holding the commit's records;
that insert is the durability point. A stale driver writes nothing, and a
commit sent again after a lost connection (whose outcome the client cannot
know) is a no-op: before sending it again the store checks whether it
landed. A background thread **folds** committed rows into the tables
(``events``, ``attempts``, ``tasks``, ...), set-based (:mod:`.fold`).

Reading: in one snapshot, the tables plus the run's commits not folded yet, applied
with :func:`ledgerflow.projection.apply`; every process reads exactly what was committed
(:class:`ledgerflow.ledger.RecordReads` over this store's primitives). The tables (users'
SQL, the ``lineage`` view) lag a live run by at most one fold; a crashed run's tail is
folded by whoever takes the run over, and a takeover based on a read another driver made
stale is refused (of two resumes at once, one drives).

Waiting. Every operation waits for a database that went away (``LEDGERFLOW_STORE_WAIT``
seconds, 180 by default), then raises ``StoreUnavailableError``. Leases (:mod:`.lease`)
expire on the server's clock after ``LEDGERFLOW_LEASE_TTL`` seconds (30), renewed every
third of that; a driver that cannot renew in time stops itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ledgerflow.errors import (
    ApprovalConflictError,
    LeaseLostError,
    NotResumableError,
    RunNotFoundError,
    StoreError,
)
from ledgerflow.ledger import RecordReads, matching
from ledgerflow.projection import apply
from ledgerflow.records import AnyRecord, ApprovalDecided, Record, RunDefined, encode_line, expand
from ledgerflow.states import RUN_ACTIVE
from ledgerflow.store import CacheHit, Lease
from ledgerflow.views import RunView, decision_dict

from . import doctor, queries
from .blobs import shared_blobs
from .connection import DEFAULT_WAIT, Connections, Database, env_seconds, is_connection_error
from .fold import FOLD_RECORDS, Folder, Mirror, commit_mirror, project, stage_tail
from .lease import DEFAULT_TTL, RUNS_CHANNEL, SIGNALS_CHANNEL, Claim, Keeper, holder, holder_gone
from .sql import (
    CLAIM_SQL,
    COMMIT_SQL,
    HELD_ON_HOST_SQL,
    LEASE_FOR_UPDATE_SQL,
    TAKE_OVER_SQL,
    commit_params,
    fold_params,
)

log = logging.getLogger("ledgerflow")
R = TypeVar("R", bound=Record)
_ACTIVE = tuple(s.value for s in RUN_ACTIVE)


class PostgresStore(RecordReads):
    """The ledger in a PostgreSQL database (see the module docstring).

    Args:
        url: a libpq URL (``postgresql://user@host:5432/db``); give the password
            through ``PGPASSWORD`` or ``~/.pgpass``, not in the URL.
        lease_ttl: seconds a lease lives unrenewed (default ``LEDGERFLOW_LEASE_TTL`` or 30).
        wait: seconds to wait for a database that went away (``LEDGERFLOW_STORE_WAIT``, 180).
        blob_dir: where large results go (``LEDGERFLOW_BLOB_DIR``; see :mod:`.blobs`).
    """

    name = "postgres"

    def __init__(self, url: str, *, lease_ttl: float | None = None, wait: float | None = None,
                 blob_dir: str | Path | None = None) -> None:
        self.location = url
        self.ttl = lease_ttl if lease_ttl is not None else env_seconds(
            "LEDGERFLOW_LEASE_TTL", DEFAULT_TTL)
        self.db = Database(url, wait=wait if wait is not None else env_seconds(
            "LEDGERFLOW_STORE_WAIT", DEFAULT_WAIT))
        self.blobs = shared_blobs(Path(blob_dir).expanduser().resolve()
                                  if blob_dir is not None else None)
        self.keeper = Keeper(self.db, self.ttl)
        self.conns = Connections(self.db, url)
        self._wlock = self.conns.wlock       # the writer connection and the mirrors
        self._mirrors: dict[str, Mirror] = {}
        self._claimed: dict[str, Lease] = {}
        self._seen: dict[str, int] = {}      # run -> lease token it was last read at
        self.folder = Folder(self.conns, self._mirrors, self._fenced)

    # -- writing --------------------------------------------------------------------------
    def create_run(self, run_id: str, records: Sequence[Record]) -> Lease:
        pid, host, start = holder()
        mirror = Mirror(1, RunView(run_id))
        scratch, rows, _, next_ord = project(mirror, records)
        body = encode_line(records)[:-1]
        # the run's first commit is folded at once: every run has its rows from the start
        fsql, fparams = fold_params(run_id, 1, (0, 0), (1, 1), rows, scratch)
        sent = [0.0]

        def attempt(retry: bool) -> None:
            con = self.conns.writer()
            if retry and con.execute("SELECT 1 FROM commits WHERE run_id = %s AND token = 1 "
                                     "AND seq = 1", [run_id]).fetchone():
                return      # the first try landed
            sent[0] = time.monotonic()
            with con.transaction():
                made = con.execute(
                    "INSERT INTO leases (run_id, token, pid, host, pid_start, expires_at) "
                    "VALUES (%s, 1, %s, %s, %s, now() + make_interval(secs => %s)) "
                    "ON CONFLICT DO NOTHING RETURNING 1",
                    [run_id, pid, host, start, self.ttl]).fetchone()
                if made is None:
                    raise StoreError(f"run {run_id} already exists in {self.db.shown}",
                                     hint="start it with a new run id")
                con.execute(COMMIT_SQL, commit_params(run_id, 1, 1, body, len(records)))
                con.execute("INSERT INTO folds (run_id, token, seq) VALUES (%s, 0, 0)",
                            [run_id])
                con.execute(fsql, fparams)

        with self._wlock:
            self.db.retrying(attempt, what=f"creating run {run_id}",
                             reset=self.conns.reset_writer)
            commit_mirror(mirror, scratch, 1, next_ord)
            mirror.folded = (1, 1)
            self._mirrors[run_id] = mirror
        self.keeper.hold(run_id, 1, sent[0] or time.monotonic())
        return Lease(run_id, 1)

    def take_over(self, run_id: str) -> Lease:
        with self._wlock:
            claimed = self._claimed.pop(run_id, None)
            if claimed is not None:     # a worker's claim already took it
                return claimed
        pid, host, start = holder()
        sent = [0.0]

        def attempt(retry: bool) -> int:
            con = self.conns.writer()
            with con.transaction():
                row = con.execute(LEASE_FOR_UPDATE_SQL, [run_id]).fetchone()
                if row is None:
                    raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
                token, lpid, lhost, lstart, expired, left = row
                mine = (lpid, lhost, lstart) == (pid, host, start)
                if retry and mine and run_id not in self.keeper.held:
                    return int(token)   # the first try took it before the connection broke
                if not expired and not holder_gone(lpid, lhost, lstart):
                    raise NotResumableError(
                        f"run {run_id} is still being driven by pid {lpid} on {lhost} "
                        f"(its lease expires in {max(0.0, float(left)):.0f}s unless renewed)",
                        hint=f"wait for it, or stop it first: pipeline cancel {run_id}")
                if self._seen.get(run_id, token) < token:   # read while another drove
                    raise queries.resumed_meanwhile(con, run_id)
                sent[0] = time.monotonic()
                con.execute(TAKE_OVER_SQL, [token + 1, pid, host, start, self.ttl, run_id])
                return int(token) + 1

        with self._wlock:
            token = self.db.retrying(attempt, what=f"taking over run {run_id}",
                                     reset=self.conns.reset_writer)
        self.keeper.hold(run_id, token, sent[0] or time.monotonic())
        self._adopt(run_id, token)
        return Lease(run_id, token)

    def _adopt(self, run_id: str, token: int) -> None:
        """Load the committed state of a run this store now drives, and fold what the
        previous driver left unfolded (its rows are the loaded state's)."""
        def load(con: Any) -> tuple[RunView, set[str], int, tuple[int, int], list[Any]]:
            got = queries.load_run(con, run_id)
            tail = queries.tail(con, run_id)
            view = got[0] if got is not None else RunView(run_id)
            if got is None and not any(isinstance(r, RunDefined) for _, _, rs in tail
                                       for r in rs):
                raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
            in_tables = set(view.tasks)
            for _, _, rs in tail:
                apply(view, rs)
            decided.extend(queries.record_rows(con, run_id, ApprovalDecided))
            for _, _, rs in tail:
                decided.extend(matching(rs, ApprovalDecided))
            return (view, in_tables, queries.next_ord(con, run_id),
                    queries.folded_to(con, run_id), tail)
        decided: list[ApprovalDecided] = []
        view, in_tables, next_ord, folded, tail = self.conns.read(load, f"loading run {run_id}")
        self._journaled(run_id, decided)
        mirror = Mirror(token, view, 0, next_ord, folded)
        if tail:
            stage_tail(mirror, tail, in_tables)
            if not self.folder.fold(mirror, end=(tail[-1][0], tail[-1][1])):
                raise LeaseLostError(f"lease lost: run {run_id} was taken over while this "
                                     "driver took it over")
        with self._wlock:
            self._mirrors[run_id] = mirror

    def claim(self, skip: Collection[str] = ()) -> Claim | None:
        """Take the lease of the oldest run that waits for a driver (``pipeline worker``).

        A run waits when it is ``submitted``, or ``running``/``cancelling`` with an
        expired lease or a holder on this host that is not alive (its driver died: the
        claim names it). Rows other workers claim are skipped (``FOR UPDATE SKIP
        LOCKED``). The lease is held from here on; :meth:`take_over` returns it.
        """
        pid, host, start = holder()
        sent = [0.0]

        def attempt(retry: bool) -> tuple[str, int, int | None] | None:
            con = self.conns.writer()
            # a dead holder on this host is taken over at once, not at lease expiry
            dead = [f"{r}/{p or 0}/{s or ''}" for r, p, s in con.execute(
                HELD_ON_HOST_SQL, [list(_ACTIVE), host]).fetchall() if holder_gone(p, host, s)]
            sent[0] = time.monotonic()
            row = con.execute(CLAIM_SQL, {"active": list(_ACTIVE), "skip": list(skip),
                                          "pid": pid, "host": host, "start": start,
                                          "ttl": self.ttl, "dead": dead}).fetchone()
            return None if row is None else (row[0], int(row[1]), row[2])

        with self._wlock:
            got = self.db.retrying(attempt, what="claiming a run", reset=self.conns.reset_writer)
        if got is None:
            return None
        run_id, token, dead = got
        self.keeper.hold(run_id, token, sent[0])
        self._adopt(run_id, token)
        lease = Lease(run_id, token)
        with self._wlock:
            self._claimed[run_id] = lease
        return Claim(lease, dead)

    def _lost(self, lease: Lease) -> LeaseLostError:
        return LeaseLostError(
            f"lease lost: {self.keeper.lost(lease.run_id, lease.token) or 'superseded'}",
            hint=f"the run is driven elsewhere or resumable: pipeline status {lease.run_id}")

    def append(self, lease: Lease, records: Sequence[Record]) -> None:
        if not records:
            return
        records = expand(records)   # the commits table and its fold hold one record a row
        run_id = lease.run_id
        if self.keeper.lost(run_id, lease.token) is not None:
            raise self._lost(lease)
        with self._wlock:
            mirror = self._mirrors.get(run_id)
            if mirror is None or mirror.token != lease.token:
                raise LeaseLostError(f"lease lost: run {run_id} token {lease.token} is not held "
                                     "here any more (taken over or released)",
                                     hint=f"watch it with: pipeline status {run_id}")
            scratch, rows, run_changed, next_ord = project(mirror, records)
            seq = mirror.seq + 1
            params = commit_params(run_id, lease.token, seq, encode_line(records)[:-1], len(records))
            check = "SELECT 1 FROM commits WHERE run_id = %s AND token = %s AND seq = %s"

            def attempt(retry: bool) -> bool:
                con = self.conns.writer()
                if retry and con.execute(check, [run_id, lease.token, seq]).fetchone():
                    return True         # it landed before the connection broke
                if con.execute(COMMIT_SQL, params).fetchone() is not None:
                    return True
                # nothing written: the lease is not ours, or this very commit exists
                return con.execute(check, [run_id, lease.token, seq]).fetchone() is not None

            landed = self.db.retrying(
                attempt, what=f"committing to run {run_id}", reset=self.conns.reset_writer,
                fenced=lambda: self.keeper.lost(run_id, lease.token),
                hint=f"start the database, then: pipeline resume {run_id}")
            if not landed:
                self._fenced(run_id, lease.token, "its commit was refused and nothing was "
                             "written")
                raise self._lost(lease)
            commit_mirror(mirror, scratch, seq, next_ord)
            self._journaled(run_id, records)
            for row, ord_ in rows:
                mirror.pending[row.key] = row
                if ord_ >= 0:
                    mirror.ords[row.key] = ord_
            mirror.run_changed = mirror.run_changed or run_changed
            mirror.records += len(records)
            if mirror.records >= FOLD_RECORDS:
                self.folder.wake()
            self.folder.start()

    def _fenced(self, run_id: str, token: int, what: str) -> None:
        held = self.keeper.held.get(run_id)
        if held is not None and held.token == token and held.lost is None:
            held.lost = (f"run {run_id} was taken over by another driver; this driver's "
                         f"token {token} is stale, so {what}")

    def lease_lost(self, lease: Lease) -> str | None:
        """Why this process lost ``lease`` (None while it holds): the runner polls this."""
        return self.keeper.lost(lease.run_id, lease.token)

    def release(self, lease: Lease) -> None:
        with self._wlock:
            mirror = self._mirrors.get(lease.run_id)
            if mirror is None or mirror.token != lease.token:
                mirror = None
            self._claimed.pop(lease.run_id, None)
        lost = self.keeper.lost(lease.run_id, lease.token)
        if mirror is not None and lost is None:
            try:     # once, without waiting: what is left unfolded is folded by the next
                self.folder.fold(mirror, wait=False)   # driver, and read from the commits meanwhile
            except Exception as exc:
                log.warning("ledgerflow: could not fold run %s at release: %s",
                            lease.run_id, exc)
        held = self.keeper.drop(lease.run_id)
        with self._wlock:
            if mirror is not None:
                self._mirrors.pop(lease.run_id, None)
            if held is None or held.token != lease.token or held.lost is not None:
                return      # not ours any more: write nothing
            try:    # once, without waiting: an unreleased lease expires by itself
                self.conns.writer().execute(
                    "WITH u AS (UPDATE leases SET expires_at = now() WHERE run_id = %s "
                    "AND token = %s RETURNING run_id) "
                    f"SELECT pg_notify('{RUNS_CHANNEL}', run_id) FROM u",
                    [lease.run_id, lease.token])
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                self.conns.reset_writer()

    # -- reading --------------------------------------------------------------------------
    @staticmethod
    def _alive(view: RunView, lease: tuple[Any, ...]) -> bool:
        unexpired, pid, host, start, _ = lease
        return bool(view.state in _ACTIVE and unexpired and not holder_gone(pid, host, start))

    def _merged(self, con: Any, run_id: str, *, tasks: bool = True,
                upstream: bool = True) -> tuple[RunView, list[AnyRecord]]:
        """The run as committed: its rows plus its unfolded commits (and those records)."""
        got = queries.load_run(con, run_id, tasks=tasks, upstream=upstream)
        if got is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
        view, lease = got
        tail = [r for _, _, rs in queries.tail(con, run_id) for r in rs]
        if tail:
            apply(view, tail)
            if not tasks:
                view.tasks = {}
        view.driver_alive = self._alive(view, lease)
        self._seen[run_id] = -1 if view.driver_alive else int(lease[4] or 0)
        return view, tail

    def get_run(self, run_id: str, *, tasks: bool = True, upstream: bool = True) -> RunView:
        return self.conns.read(
            lambda con: self._merged(con, run_id, tasks=tasks, upstream=upstream)[0],
            f"reading run {run_id}")

    def list_runs(self, limit: int = 50) -> list[RunView]:
        def read(con: Any) -> list[RunView]:
            out = []
            for view, _ in queries.list_runs(con, limit):
                if view.state in _ACTIVE:   # its last commits may not be folded yet
                    view = self._merged(con, view.run_id, upstream=False)[0]
                    view.task_counts = view.counts()
                    view.tasks = {}
                else:
                    view.driver_alive = False
                out.append(view)
            return out
        return self.conns.read(read, "listing runs")

    def request_cancel(self, run_id: str) -> None:
        def send(con: Any) -> bool:
            row = con.execute(
                "WITH s AS (INSERT INTO signals (run_id, kind, token) "
                "SELECT l.run_id, 'cancel', l.token FROM leases l JOIN runs r USING (run_id) "
                "WHERE l.run_id = %s RETURNING run_id) "
                f"SELECT pg_notify('{SIGNALS_CHANNEL}', run_id) FROM s", [run_id]).fetchone()
            return row is not None
        if not self.conns.read(send, f"cancelling run {run_id}", in_snapshot=False):
            raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
        self.keeper.mark_cancel(run_id)

    def cancel_requested(self, run_id: str) -> bool:
        local = self.keeper.cancelled(run_id)
        if local is not None:
            return local
        return bool(self.conns.read(lambda con: con.execute(
            "SELECT 1 FROM signals s JOIN leases l USING (run_id) WHERE s.run_id = %s "
            "AND s.kind = 'cancel' AND s.token >= l.token LIMIT 1", [run_id]).fetchone(),
            f"reading run {run_id}"))

    # -- the shared read side's primitives (see :class:`ledgerflow.ledger.RecordReads`) ---
    def _cache_read(self, names: list[str], exclude_run: str | None,
                    limit: int | None) -> dict[str, CacheHit] | set[str]:
        return self.conns.read(
            lambda con: queries.CACHED.read(con, names, exclude_run, limit),
            "reading the cache")

    def _kind_rows(self, run_id: str, kind: type[R], *, task_key: str | None = None,
                   attempt: int | None = None) -> list[R]:
        """The rows of an append-only kind: folded ones, then the unfolded commits'."""
        def read(con: Any) -> list[R]:
            if not queries.has_run(con, run_id):
                raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
            rows: list[R] = queries.record_rows(con, run_id, kind, task_key=task_key,
                                                attempt=attempt)
            for _, _, rs in queries.tail(con, run_id):
                rows += matching(rs, kind, task_key, attempt)
            return rows
        return self.conns.read(read, f"reading run {run_id}")

    def _side_decisions(self, run_id: str) -> list[dict[str, Any]]:
        """Decisions made by any process: the ``signals`` rows."""
        def read(con: Any) -> list[dict[str, Any]]:
            return [json.loads(p) for (p,) in con.execute(
                "SELECT payload FROM signals WHERE run_id = %s AND kind = 'decision' "
                "ORDER BY id", [run_id])]
        return self.conns.read(read, f"reading run {run_id}")

    # -- approvals and steps -------------------------------------------------------------
    def decide(self, run_id: str, task_key: str, digest: str, decision: str, by: str,
               reason: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record a decision on an approval request from any process: a ``signals`` row
        (unique per request digest: the first decider wins) and a NOTIFY."""
        doc = {"task_key": task_key, "digest": digest, "decision": decision,
               "decided_by": by, "reason": reason, "decided_at": time.time(),
               **({} if arguments is None else {"arguments": arguments})}

        def send(con: Any) -> dict[str, Any] | None:
            if not queries.has_run(con, run_id):
                raise RunNotFoundError(f"no run {run_id!r} in {self.db.shown}")
            row = con.execute(
                "WITH s AS (INSERT INTO signals (run_id, kind, task_key, digest, payload, "
                "token) SELECT run_id, 'decision', %s, %s, %s, token FROM leases "
                "WHERE run_id = %s ON CONFLICT (run_id, digest) WHERE kind = 'decision' "
                f"DO NOTHING RETURNING run_id) SELECT pg_notify('{SIGNALS_CHANNEL}', run_id) "
                "FROM s", [task_key, digest, json.dumps(doc), run_id]).fetchone()
            if row is not None:
                return None
            other = con.execute("SELECT payload FROM signals WHERE run_id = %s AND "
                                "kind = 'decision' AND digest = %s", [run_id, digest]).fetchone()
            return json.loads(other[0]) if other else {"decision": "decided",
                                                        "decided_by": "another process"}
        other = self.conns.read(send, f"deciding on run {run_id}", in_snapshot=False)
        if other is not None:
            raise ApprovalConflictError(
                f"the request {digest[:12]} of {task_key} was already "
                f"{other['decision']} by {other['decided_by']}",
                hint=f"see it with: pipeline approvals {run_id}")
        self.keeper.add_decision(run_id, doc)
        return doc

    def _journaled(self, run_id: str, records: Iterable[Record]) -> None:
        """The keeper's decisions of a held run include the journaled ones."""
        for r in records:
            if type(r) is ApprovalDecided:
                self.keeper.add_decision(run_id, decision_dict(r))

    def approval_decisions(self, run_id: str) -> list[dict[str, Any]]:
        held = self.keeper.decisions(run_id)
        if held is not None:       # polled by the runner: from the keeper's memory
            return held
        return super().approval_decisions(run_id)

    # -- recovery -------------------------------------------------------------------------
    def recover(self) -> None:
        """Fold what drivers that are gone left unfolded (the tables and the cache
        index catch up); a takeover does it too."""
        self.folder.recover()

    def fold(self) -> list[str]:
        """Fold now: the runs this store drives, and what gone drivers left; returns the
        runs folded (``pipeline fold``)."""
        with self._wlock:
            mirrors = list(self._mirrors.values())
        done = [m.view.run_id for m in mirrors if m.records and self.folder.fold(m)]
        return done + self.folder.recover()

    def doctor(self) -> list[dict[str, Any]]:
        """What is wrong with the ledger, in plain words (``pipeline doctor``)."""
        return doctor.examine(self.conns, self.blobs)

    def repair(self) -> tuple[str, list[str]]:
        """Rebuild every run's rows from its commits, in place (see :mod:`.doctor`)."""
        return doctor.rebuild(self.conns, self.folder)

    def worker_folders(self, run_id: str) -> tuple[str, str]:
        """(the shared result directory, this run's folder in it): where workers keep
        durable files (step logs, budgets); every machine reaches it (see :mod:`.blobs`)."""
        return str(self.blobs.root), str(self.blobs.root / "runs" / run_id)

    def driver_alive(self, run_id: str) -> bool:
        """True if a driver holds an unexpired lease of ``run_id``."""
        return bool(self.get_run(run_id, tasks=False).driver_alive)

    def close(self) -> None:
        for run_id, mirror in list(self._mirrors.items()):
            self.release(Lease(run_id, mirror.token))
        self.keeper.close()
        self.conns.close()
