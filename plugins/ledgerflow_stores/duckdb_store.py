"""The ``duckdb`` store: the ledger as one DuckDB file plus per-run journals.

DuckDB lets one process hold a file read-write and then no other process can
open it at all, and a statement per transition costs ~0.5 ms. So the driver
never keeps the file open. It appends each group commit as one JSON line to
a per-run journal (``<ledger>.d/journals/<run>.<token>.jsonl``: one
``write()``, plus ``fsync`` with ``LEDGERFLOW_SYNC=full``) - that append is
the durability point - and folds journals into the DuckDB tables in
set-based batches (DuckDB's JSON reader, ``INSERT ... SELECT``, one
``UPDATE``), opening the file only for the fold: a background thread folds
while the run goes on (:class:`_Folder`), the driver folds the tail at the
end. Readers in any
process open the file read-only for a moment and add the unfolded journal
tail, so ``status``, ``runs`` and ``cancel`` work while a run is active;
a lock held by someone else is waited out briefly, then reported as
:class:`~ledgerflow.errors.StoreLockedError`.

Leases: ``<ledger>.d/runs/<run>/lease`` names the driving pid, host and
fencing token and is refreshed every second. A takeover (resume) folds
what the old driver left, bumps the token and starts a new journal segment;
bytes a superseded driver still appends to its old segment are never folded
(a notice records how many were rejected).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb

from ledgerflow import hookimpl
from ledgerflow.config import Settings
from ledgerflow.errors import (
    LeaseLostError,
    NotALedgerError,
    NotResumableError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
    StoreLockedError,
)
from ledgerflow.results import Encoded, decode
from ledgerflow.store import Lease, RunView, TaskRow, apply
from ledgerflow_stores.memory import attempt_dict, lineage_rows

log = logging.getLogger("ledgerflow")

SCHEMA_VERSION = 1
INLINE_LIMIT = 2048
FOLD_BATCH_BYTES = 4 << 20
#: Journal bytes folded on one connection before it is closed and the file left free.
FOLD_BITE_BYTES = 2 * FOLD_BATCH_BYTES
#: Journal bytes that wake the background fold (see :class:`_Folder`).
FOLD_WAKE_BYTES = 1 << 20
#: DuckDB's memory limit during a fold (a batch that needs more is retried without).
FOLD_MEMORY = "128MB"
TERMINAL_SQL = "('succeeded','failed','cancelled','upstream_failed')"

MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        "CREATE TABLE meta(key VARCHAR PRIMARY KEY, value VARCHAR)",
        """CREATE TABLE runs(run_id VARCHAR PRIMARY KEY, pipeline VARCHAR, target VARCHAR,
            params VARCHAR, options VARCHAR, state VARCHAR, reason VARCHAR,
            created_at DOUBLE, ended_at DOUBLE, token INTEGER, driver_pid INTEGER,
            driver_host VARCHAR, max_seq BIGINT)""",
        """CREATE TABLE tasks(run_id VARCHAR, task_key VARCHAR, task_name VARCHAR,
            node VARCHAR, item_key VARCHAR, position INTEGER, upstream VARCHAR[], code_version VARCHAR,
            state VARCHAR, attempts INTEGER, budget_base INTEGER, started_at DOUBLE,
            ended_at DOUBLE, error VARCHAR, fingerprint VARCHAR, result_hash VARCHAR,
            result_kind VARCHAR, result_data VARCHAR, result_uri VARCHAR,
            result_size BIGINT, cached_from VARCHAR, result_attempt INTEGER)""",
        """CREATE TABLE events(run_id VARCHAR, seq BIGINT, task_key VARCHAR,
            attempt INTEGER, from_state VARCHAR, to_state VARCHAR, reason VARCHAR,
            ts DOUBLE, token INTEGER)""",
        """CREATE TABLE attempts(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            outcome VARCHAR, started_at DOUBLE, ended_at DOUBLE, error_type VARCHAR,
            error_message VARCHAR, traceback VARCHAR, token INTEGER)""",
        """CREATE TABLE results(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            fingerprint VARCHAR, content_hash VARCHAR, kind VARCHAR, data VARCHAR,
            uri VARCHAR, size BIGINT, cached_from VARCHAR)""",
        """CREATE TABLE artifacts(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            direction VARCHAR, uri VARCHAR, content_hash VARCHAR, attrs VARCHAR)""",
        """CREATE TABLE notices(run_id VARCHAR, task_key VARCHAR, attempt INTEGER,
            kind VARCHAR, message VARCHAR, ts DOUBLE)""",
        """CREATE TABLE journal_folds(run_id VARCHAR, token INTEGER, "offset" BIGINT,
            PRIMARY KEY(run_id, token))""",
        """CREATE VIEW lineage AS
            SELECT t.run_id, t.task_key, t.result_attempt AS attempt, 'input' AS direction,
                   'task:' || ut.task_key AS uri, ut.result_hash AS content_hash,
                   t.code_version, NULL::VARCHAR AS attrs
            FROM tasks t, unnest(t.upstream) AS u(up)
            JOIN tasks ut ON ut.run_id = t.run_id AND (ut.task_key = u.up
                 OR (ut.node = u.up AND ut.position IS NOT NULL))
            UNION ALL
            SELECT run_id, task_key, result_attempt, 'output', 'task:' || task_key,
                   result_hash, code_version, NULL FROM tasks WHERE state = 'succeeded'
            UNION ALL
            SELECT a.run_id, a.task_key, a.attempt, a.direction, a.uri, a.content_hash,
                   t.code_version, a.attrs
            FROM artifacts a LEFT JOIN tasks t USING (run_id, task_key)""",
    ]),
]


def _json_dumps() -> Callable[[Any], str]:
    """Compact JSON for journal lines: the C encoder built once, not per call."""
    enc = json.JSONEncoder(separators=(",", ":"))
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return enc.encode
    try:
        c = make(None, enc.default, json.encoder.encode_basestring_ascii, None, ":", ",",
                 False, False, True)
        if "".join(c([["x", 1, 1.5, None, True]], 0)) != '[["x",1,1.5,null,true]]':
            return enc.encode
    except TypeError:       # another signature: use the public path
        return enc.encode
    return lambda value: "".join(c(value, 0))


_dumps = _json_dumps()

_PROCESS_LOCKS: dict[str, threading.RLock] = {}
_PL_GUARD = threading.Lock()


def _process_lock(path: str) -> threading.RLock:
    with _PL_GUARD:
        return _PROCESS_LOCKS.setdefault(path, threading.RLock())


_HELD_FOR_FORK: list[threading.RLock] = []


def _before_fork() -> None:
    # A fork (the processes executor starting a worker) must not copy the process
    # while a background fold is inside DuckDB: take every ledger's lock first
    with _PL_GUARD:
        locks = [_PROCESS_LOCKS[path] for path in sorted(_PROCESS_LOCKS)]
    for lock in locks:
        lock.acquire()
        _HELD_FOR_FORK.append(lock)
    _PL_GUARD.acquire()


def _after_fork() -> None:
    while _HELD_FOR_FORK:
        _HELD_FOR_FORK.pop().release()
    _PL_GUARD.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork,
                    after_in_child=_after_fork)


def _proc_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        return fields[19]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int, start: str | None) -> bool:
    if os.path.isdir("/proc"):
        now = _proc_start(pid)
        return now is not None and (start is None or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DuckDBStore:
    """The default ledger (see the module docstring for the design)."""

    name = "duckdb"

    def __init__(self, path: str, *, sync: str | None = None, fold_interval: float = 5.0,
                 lock_timeout: float | None = None) -> None:
        p = Path(path).expanduser()
        if p.is_dir():
            raise StoreError(f"ledger path is a directory: {path}",
                             hint="pass --store DIR/ledger.duckdb")
        self.location = str(p.resolve())
        self.side = Path(self.location + ".d")
        self.sync = (sync or os.environ.get("LEDGERFLOW_SYNC", "normal")).lower()
        self.fold_interval = fold_interval
        self.lock_timeout = lock_timeout if lock_timeout is not None else float(
            os.environ.get("LEDGERFLOW_LOCK_TIMEOUT", "30"))
        self._plock = _process_lock(self.location)
        self._validated = False
        self._fds: dict[str, tuple[int, int]] = {}      # run_id -> (token, fd)
        self._beats: dict[str, _Heartbeat] = {}
        self._folders: dict[str, _Folder] = {}

    # -- files ---------------------------------------------------------------------------
    def _journals(self) -> Path:
        return self.side / "journals"

    def _segments(self, run_id: str) -> list[tuple[int, Path]]:
        d = self._journals()
        out = []
        if d.is_dir():
            for f in d.glob(f"{run_id}.*.jsonl"):
                try:
                    out.append((int(f.name[len(run_id) + 1:-6]), f))
                except ValueError:
                    continue
        return sorted(out)

    def _run_dir(self, run_id: str) -> Path:
        return self.side / "runs" / run_id

    def _open_segment(self, run_id: str, token: int) -> int:
        self._journals().mkdir(parents=True, exist_ok=True)
        path = self._journals() / f"{run_id}.{token}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fds[run_id] = (token, fd)
        return fd

    def _write_lease(self, run_id: str, token: int) -> None:
        d = self._run_dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        doc = {"token": token, "pid": pid, "host": socket.gethostname(),
               "start": _proc_start(pid), "heartbeat": time.time()}
        tmp = d / f"lease.{pid}.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, d / "lease")

    def _read_lease(self, run_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((self._run_dir(run_id) / "lease").read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def driver_alive(self, run_id: str) -> bool:
        """True if the lease of ``run_id`` is held by a live process."""
        lease = self._read_lease(run_id)
        if lease is None:
            return False
        if lease.get("host") == socket.gethostname():
            return _pid_alive(int(lease["pid"]), lease.get("start"))
        return time.time() - float(lease.get("heartbeat", 0)) < 10.0

    # -- database ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _db(self, write: bool, timeout: float | None = None) -> Iterator[Any]:
        with self._plock:
            if not write and not os.path.exists(self.location):
                yield None
                return
            con = self._connect(write, self.lock_timeout if timeout is None else timeout)
            try:
                yield con
            finally:
                con.close()

    def _connect(self, write: bool, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                if write and not self._validated and os.path.exists(self.location):
                    ro = duckdb.connect(self.location, read_only=True)
                    try:
                        self._check(ro)
                    finally:
                        ro.close()
                if write:
                    Path(self.location).parent.mkdir(parents=True, exist_ok=True)
                con = duckdb.connect(self.location, read_only=not write)
            except duckdb.IOException as exc:
                msg = str(exc)
                if "lock" in msg.lower():
                    if time.monotonic() >= deadline:
                        raise StoreLockedError(
                            f"ledger {self.location} is locked by another process") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.1)
                    continue
                if "not a valid DuckDB" in msg:
                    raise NotALedgerError(f"{self.location} is not a ledgerflow ledger "
                                          "(not a DuckDB file)") from None
                raise StoreError(f"cannot open ledger {self.location}: {msg}",
                                 hint="check the path and its permissions") from None
            try:
                if write:
                    self._migrate(con)
                else:
                    self._check(con)
            except BaseException:
                con.close()
                raise
            return con

    def _check(self, con: Any) -> int:
        try:    # the common case in one cheap query (the catalog query costs ~4 ms)
            row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        except duckdb.CatalogException:
            tables = con.execute("SELECT table_name FROM information_schema.tables").fetchall()
            if not tables:
                return 0
            raise NotALedgerError(f"{self.location} is a DuckDB file but not a ledgerflow "
                                  "ledger (no meta table)") from None
        version = int(row[0][0]) if row else 0
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"ledger {self.location} has schema version {version}; this ledgerflow "
                f"reads up to {SCHEMA_VERSION}")
        self._validated = True
        return version

    def _migrate(self, con: Any) -> None:
        version = self._check(con)
        for target, statements in MIGRATIONS:
            if target <= version:
                continue
            con.execute("BEGIN")
            try:
                for sql in statements:
                    con.execute(sql)
                con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                            [str(target)])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        self._validated = True

    # -- writing -------------------------------------------------------------------------
    def create_run(self, run_id: str, records: Sequence[Sequence[Any]]) -> Lease:
        if os.path.exists(self.location) and not self._validated:
            with self._db(False):
                pass
        self._write_lease(run_id, 1)
        self._open_segment(run_id, 1)
        lease = Lease(run_id, 1)
        self._beats[run_id] = _Heartbeat(self, run_id, 1)
        self._folders[run_id] = _Folder(self, run_id)
        self.append(lease, records)
        return lease

    def take_over(self, run_id: str) -> Lease:
        with self._db(True) as con:
            self._fold_run(con, run_id)
            row = con.execute("SELECT token, state FROM runs WHERE run_id = ?",
                              [run_id]).fetchall()
            if not row:
                raise RunNotFoundError(f"no run {run_id!r} in {self.location}")
            if self.driver_alive(run_id):
                lease = self._read_lease(run_id) or {}
                raise NotResumableError(
                    f"run {run_id} is still being driven by pid {lease.get('pid')} on "
                    f"{lease.get('host')}",
                    hint=f"wait for it, or stop it first: pipeline cancel {run_id}")
            seg_tokens = [t for t, _ in self._segments(run_id)]
            token = max([row[0][0] or 0, *seg_tokens]) + 1
            con.execute("UPDATE runs SET token = ? WHERE run_id = ?", [token, run_id])
            with contextlib.suppress(FileNotFoundError):
                (self._run_dir(run_id) / "cancel").unlink()
            self._write_lease(run_id, token)
            self._open_segment(run_id, token)
        self._beats[run_id] = _Heartbeat(self, run_id, token)
        self._folders[run_id] = _Folder(self, run_id)
        return Lease(run_id, token)

    def append(self, lease: Lease, records: Sequence[Sequence[Any]]) -> None:
        if not records:
            return
        entry = self._fds.get(lease.run_id)
        beat = self._beats.get(lease.run_id)
        if entry is None or entry[0] != lease.token or (beat is not None and beat.fenced):
            raise LeaseLostError(f"run {lease.run_id} was taken over by another driver; "
                                 f"token {lease.token} is no longer valid")
        data = (_dumps(records) + "\n").encode()
        fd = entry[1]
        os.write(fd, data)
        if self.sync == "full":
            os.fsync(fd)
        folder = self._folders.get(lease.run_id)
        if folder is not None:
            folder.wrote(len(data))

    def release(self, lease: Lease) -> None:
        folder = self._folders.pop(lease.run_id, None)
        if folder is not None:
            folder.stop()
        beat = self._beats.pop(lease.run_id, None)
        if beat is not None:
            beat.stop()
        entry = self._fds.pop(lease.run_id, None)
        if entry is None:
            return
        os.close(entry[1])     # each commit is already as durable as LEDGERFLOW_SYNC asks
        if beat is not None and beat.fenced:
            return
        try:
            more = True
            while more:
                # in bites, each on a fresh connection: DuckDB keeps what it cached while
                # a connection stays open, on top of the run's own memory
                with self._db(True) as con:
                    more = self._fold_run(con, lease.run_id, max_bytes=FOLD_BITE_BYTES)
                    if more:
                        continue
                    state = con.execute("SELECT state FROM runs WHERE run_id = ?",
                                        [lease.run_id]).fetchall()
                    if state and state[0][0] in ("succeeded", "failed", "cancelled"):
                        # fully folded and finished: the journal has served its purpose
                        for _, seg in self._segments(lease.run_id):
                            seg.unlink(missing_ok=True)
        except StoreLockedError:
            pass   # readers add the tail; the next writer folds it
        lease_doc = self._read_lease(lease.run_id)
        if lease_doc and lease_doc.get("token") == lease.token:
            with contextlib.suppress(FileNotFoundError):
                (self._run_dir(lease.run_id) / "lease").unlink()

    def fold(self) -> None:
        """Fold every journal into the DuckDB file now."""
        with self._db(True) as con:
            runs = {f.name.split(".", 1)[0] for f in self._journals().glob("*.jsonl")} \
                if self._journals().is_dir() else set()
            for run_id in sorted(runs):
                self._fold_run(con, run_id)

    # -- folding -------------------------------------------------------------------------
    def _fold_run(self, con: Any, run_id: str, max_bytes: int | None = None) -> bool:
        """Fold ``run_id``'s journal; with ``max_bytes``, stop after about that much.

        Returns True if journal was left unfolded because of ``max_bytes``.
        """
        segs = self._segments(run_id)
        if not segs:
            return False
        # the fold works in bounded batches; without a limit DuckDB keeps ~1 KB a folded
        # task cached (the limit costs ~10% more time at 100k tasks)
        con.execute(f"SET memory_limit='{FOLD_MEMORY}'")
        try:
            return self._fold_segments(con, run_id, segs, max_bytes)
        except duckdb.OutOfMemoryException:
            # DuckDB cannot spill every operator: what needs more than the limit gets
            # it (each batch committed with its offset, so this continues, not redoes)
            log.info("fold of run %s needs more than %s; retrying without the limit",
                     run_id, FOLD_MEMORY)
            con.execute("RESET memory_limit")
            return self._fold_segments(con, run_id, self._segments(run_id), max_bytes)

    def _fold_segments(self, con: Any, run_id: str, segs: list[tuple[int, Path]],
                       max_bytes: int | None) -> bool:
        budget = max_bytes
        folded = dict(con.execute('SELECT token, "offset" FROM journal_folds WHERE run_id = ?',
                                  [run_id]).fetchall())
        row = con.execute("SELECT token FROM runs WHERE run_id = ?", [run_id]).fetchall()
        current = max([(row[0][0] or 0) if row else 0, *(t for t, _ in segs)])
        for token, path in segs:
            start = folded.get(token, 0)
            stale = token < current and token in folded
            # one transaction per bounded batch, its journal offset committed with it:
            # memory stays flat however long the journal is, and a crash mid-fold
            # resumes from the last committed batch
            for body, end in _iter_lines(path, start, FOLD_BATCH_BYTES):
                self._fold_batch(con, run_id, token, stale, body, end)
                if budget is not None:
                    budget -= len(body)
                    if budget <= 0:
                        return True
        return False

    def _fold_batch(self, con: Any, run_id: str, token: int, stale: bool, body: bytes,
                    end: int) -> None:
        """One batch of journal lines and its journal offset, in one transaction."""
        con.execute("BEGIN")
        try:
            if stale:   # what a superseded driver wrote after the takeover
                count = sum(len(json.loads(line)) for line in body.split(b"\n") if line)
                con.execute("INSERT INTO notices VALUES (?, NULL, NULL, ?, ?, ?)",
                            [run_id, "stale_driver_rejected",
                             f"rejected {count} record(s) written under superseded "
                             f"token {token}", time.time()])
            else:
                _insert(con, run_id, token, body,
                        self.side / "tmp" / f"fold-{os.getpid()}-{threading.get_ident()}.json")
            con.execute("INSERT OR REPLACE INTO journal_folds VALUES (?, ?, ?)",
                        [run_id, token, end])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    # -- results -------------------------------------------------------------------------
    def put_blob(self, enc: Encoded) -> str | None:
        if enc.kind == "json" and enc.size <= INLINE_LIMIT:
            return None
        ext = {"arrow": "parquet", "pickle": "pkl", "json": "json"}[enc.kind]
        rel = f"results/{enc.hash[:2]}/{enc.hash}.{ext}"
        path = self.side / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            if enc.kind == "arrow":
                import pyarrow.parquet as pq
                pq.write_table(decode("arrow", enc.data), tmp)
            else:
                tmp.write_bytes(enc.data)
            os.replace(tmp, path)
        return rel

    def read_blob(self, kind: str, data: str | None, uri: str | None) -> Any:
        if uri is None:
            return decode(kind, (data or "null").encode())
        path = self.side / uri
        if kind == "arrow":
            import pyarrow.parquet as pq
            return pq.read_table(path)
        raw = path.read_bytes()
        return pickle.loads(raw) if kind == "pickle" else json.loads(raw)

    def result_path(self, uri: str) -> str:
        """The file behind a result URI (Parquet for tables: ``read_parquet`` it)."""
        return str(self.side / uri)

    # -- reading -------------------------------------------------------------------------
    def _tail(self, run_id: str, folded: dict[int, int]) -> list[Any]:
        segs = self._segments(run_id)
        if not segs:
            return []
        current = max(t for t, _ in segs)
        records: list[Any] = []
        for token, path in segs:
            if token < current and token in folded:
                continue  # what an old driver wrote after the takeover is not applied
            lines, _ = _read_lines(path, folded.get(token, 0))
            for line in lines:
                records.extend(json.loads(line))
        return records

    def _load(self, con: Any, run_id: str, *, tasks: bool = True,
              upstream: bool = True) -> tuple[RunView | None, dict[int, int]]:
        if con is None:
            return None, {}
        row = con.execute(
            "SELECT pipeline, target, params, options, created_at, state, reason, ended_at, "
            "token, max_seq, driver_pid, driver_host FROM runs WHERE run_id = ?",
            [run_id]).fetchall()
        folded = dict(con.execute('SELECT token, "offset" FROM journal_folds WHERE run_id = ?',
                                  [run_id]).fetchall())
        if not row:
            return None, folded
        (pipeline, target, params, options, created, state, reason, ended, token, max_seq,
         pid, host) = row[0]
        view = RunView(run_id, pipeline=pipeline, target=target, params=params or "{}",
                       options=options or "{}", created_at=created or 0.0, state=state,
                       reason=reason or "", ended_at=ended, token=token or 0,
                       max_seq=max_seq or 0, driver_pid=pid, driver_host=host)
        if not tasks:
            return view, folded
        # upstream lists are the costliest column to turn into Python: only lineage needs them
        ups = "upstream" if upstream else "NULL"
        rows = con.execute(
            f"SELECT task_key, task_name, node, item_key, position, {ups}, code_version, state, "
            "attempts, budget_base, started_at, ended_at, error, fingerprint, result_hash, "
            "result_kind, result_data, result_uri, result_size, cached_from, result_attempt "
            "FROM tasks WHERE run_id = ? ORDER BY rowid", [run_id]).fetchall()
        by_key = view.tasks
        for r in rows:
            by_key[r[0]] = TaskRow(r[0], r[1], r[2], r[3], r[4], list(r[5] or ()), r[6], r[7],
                                   r[8] or 0, r[9] or 0, r[10], r[11], r[12], r[13], r[14],
                                   r[15], r[16], r[17], r[18] or 0, r[19], r[20] or 0)
        return view, folded

    def get_run(self, run_id: str, *, tasks: bool = True, upstream: bool = True) -> RunView:
        with self._db(False) as con:
            view, folded = self._load(con, run_id, tasks=tasks, upstream=upstream)
            tail = self._tail(run_id, folded)
        if not tasks:
            tail = [r for r in tail if r[0] in ("D", "H", "S")]
        if view is None:
            if not tail:
                raise RunNotFoundError(f"no run {run_id!r} in {self.location}")
            view = RunView(run_id)
        apply(view, tail)
        view.driver_alive = self.driver_alive(run_id) if view.state in (
            "running", "cancelling") else False
        return view

    def _journal_runs(self) -> set[str]:
        d = self._journals()
        if not d.is_dir():
            return set()
        return {f.name.rsplit(".", 2)[0] for f in d.glob("*.jsonl")}

    def list_runs(self, limit: int = 50) -> list[RunView]:
        views: dict[str, RunView] = {}
        with self._db(False) as con:
            if con is not None:
                rows = con.execute(
                    "SELECT run_id, pipeline, state, reason, created_at, ended_at, target, "
                    "params, options FROM runs ORDER BY created_at DESC LIMIT ?",
                    [limit]).fetchall()
                counts = con.execute(
                    "SELECT run_id, state, count(*) FROM tasks WHERE run_id IN "
                    "(SELECT run_id FROM runs ORDER BY created_at DESC LIMIT ?) "
                    "GROUP BY ALL", [limit]).fetchall()
                for rid, pipe, state, reason, created, ended, target, params, opts in rows:
                    views[rid] = RunView(rid, pipeline=pipe, state=state, reason=reason or "",
                                         created_at=created or 0.0, ended_at=ended,
                                         target=target, params=params or "{}",
                                         options=opts or "{}", task_counts={})
                for rid, state, n in counts:   # task rows are not loaded for a listing
                    views[rid].task_counts[state] = n  # type: ignore[index]
        for rid in self._journal_runs():
            try:
                views[rid] = self.get_run(rid)
            except RunNotFoundError:
                continue
        out = sorted(views.values(), key=lambda v: v.created_at, reverse=True)[:limit]
        for v in out:
            if v.state in ("running", "cancelling") and v.driver_alive is None:
                v.driver_alive = self.driver_alive(v.run_id)
        return out

    def request_cancel(self, run_id: str) -> None:
        self.get_run(run_id)
        d = self._run_dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cancel").write_text(str(time.time()))

    def cancel_requested(self, run_id: str) -> bool:
        return os.path.exists(self.side / "runs" / run_id / "cancel")

    def cache_lookup(self, task_names: Iterable[str],
                     exclude_run: str | None = None) -> dict[str, tuple[Any, ...]]:
        names = list(task_names)
        out: dict[str, tuple[Any, ...]] = {}
        if not names:
            with self._db(False):
                return out
        with self._db(False) as con:
            if con is None:
                return out
            # one row per fingerprint (the newest run's): the index grows with the
            # distinct work done, not with how many times it was re-run
            rows = con.execute(
                "SELECT DISTINCT ON (fingerprint) fingerprint, run_id, task_key, result_hash, "
                "result_kind, result_data, result_uri, result_size FROM tasks "
                "WHERE state = 'succeeded' AND fingerprint IS NOT NULL "
                "AND task_name IN (SELECT unnest($1::VARCHAR[])) "
                "AND run_id IS DISTINCT FROM $2 ORDER BY fingerprint, run_id DESC",
                [names, exclude_run]).fetchall()
        for fp, *rest in rows:
            out[fp] = tuple(rest)
        return out

    def _records(self, run_id: str, kind: str, sql: str,
                 tasks: bool = False) -> tuple[RunView, list[Any]]:
        # only lineage needs the task rows; the others check that the run exists
        view = self.get_run(run_id, tasks=tasks)
        with self._db(False) as con:
            rows = [] if con is None else [(kind, *r) for r in con.execute(sql, [run_id])
                                           .fetchall()]
            _, folded = self._load(con, run_id, tasks=False)
            tail = [r for r in self._tail(run_id, folded) if r[0] == kind]
        return view, rows + tail

    def lineage(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        view, rows = self._records(
            run_id, "L", "SELECT task_key, attempt, direction, uri, content_hash, attrs "
            "FROM artifacts WHERE run_id = ? ORDER BY rowid", tasks=True)
        fixed = [(r[0], r[1], r[2], r[3], r[4], r[5],
                  json.loads(r[6]) if isinstance(r[6], str) else r[6]) for r in rows]
        return lineage_rows(view, fixed, task_key)

    def notices(self, run_id: str) -> list[dict[str, Any]]:
        _, rows = self._records(
            run_id, "N", "SELECT task_key, attempt, kind, message, ts FROM notices "
            "WHERE run_id = ? ORDER BY rowid")
        return [{"task_key": r[1], "attempt": r[2], "kind": r[3], "message": r[4], "at": r[5]}
                for r in rows]

    def attempts(self, run_id: str, task_key: str | None = None) -> list[dict[str, Any]]:
        _, rows = self._records(
            run_id, "A", "SELECT task_key, attempt, outcome, started_at, ended_at, error_type, "
            "error_message, traceback FROM attempts WHERE run_id = ? ORDER BY rowid")
        return [attempt_dict(r) for r in rows if task_key is None or r[1] == task_key]

    def close(self) -> None:
        for run_id in list(self._fds):
            self.release(Lease(run_id, self._fds[run_id][0]))


class _Heartbeat:
    """Refreshes a lease every second; notices when another driver took over."""

    def __init__(self, store: DuckDBStore, run_id: str, token: int) -> None:
        self.store, self.run_id, self.token = store, run_id, token
        self.fenced = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ledgerflow-lease-{run_id}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            doc = self.store._read_lease(self.run_id)
            if doc is None or int(doc.get("token", 0)) > self.token:
                self.fenced = True   # taken over (or released by a newer driver)
                return
            with contextlib.suppress(OSError):
                self.store._write_lease(self.run_id, self.token)

    def stop(self) -> None:
        self._stop.set()


class _Folder:
    """Folds a run's journal into the file in the background while the run goes on.

    Woken when ``FOLD_WAKE_BYTES`` of journal were written, or every
    ``fold_interval`` seconds if anything was. DuckDB releases the GIL while it
    works, so on a machine with a spare core the fold overlaps the driver
    instead of adding to it, and the fold left at release is only the tail.
    Each wake-up folds at most ``FOLD_BITE_BYTES`` and then leaves the file
    free for a while. A fold that finds the file locked (a reader) is retried
    at the next wake-up; the journal is the durable copy either way.
    """

    def __init__(self, store: DuckDBStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self.pending = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ledgerflow-fold-{run_id}")
        self._thread.start()

    def wrote(self, n: int) -> None:
        self.pending += n
        if self.pending >= FOLD_WAKE_BYTES:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.store.fold_interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            if not self.pending:
                continue
            self.pending = 0     # advisory: bytes written meanwhile wake the next fold
            started = time.monotonic()
            try:
                # a bounded bite, then the file is free again: readers in other
                # processes and a fork waiting for the lock get their turn
                with self.store._db(True, timeout=0.05) as con:
                    if self.store._fold_run(con, self.run_id, max_bytes=FOLD_BITE_BYTES):
                        self.pending = FOLD_WAKE_BYTES
            except StoreLockedError:
                self.pending = 1
            except Exception:   # the fold at release reports what is still wrong
                log.warning("background fold of run %s failed", self.run_id, exc_info=True)
            # leave the file free a quarter of the time (at least 50 ms)
            if self._stop.wait(max(0.05, (time.monotonic() - started) / 3)):
                return
            if self.pending >= FOLD_WAKE_BYTES:
                self._wake.set()

    def stop(self) -> None:
        """Stop folding; waits for a fold in progress (the caller folds the rest)."""
        self._stop.set()
        self._wake.set()
        self._thread.join()


def _read_lines(path: Path, start: int) -> tuple[list[bytes], int]:
    """Complete lines of ``path`` from byte ``start``; a torn last line is left out."""
    lines: list[bytes] = []
    end = start
    for body, offset in _iter_lines(path, start, 0):
        lines.extend(ln for ln in body.split(b"\n") if ln)
        end = offset
    return lines, end


def _iter_lines(path: Path, start: int, limit: int) -> Iterator[tuple[bytes, int]]:
    """Yield runs of complete lines (about ``limit`` bytes each, 0: all; without
    the last newline) and the offset after them; a torn last line is left out."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        fh.seek(start)
        offset = start
        pending = b""
        while True:
            data = pending + fh.read(max(limit - len(pending), 1 << 16) if limit else -1)
            cut = data.rfind(b"\n")
            if cut < 0:
                more = fh.read(1 << 22)     # one line longer than the batch: read it all
                if not more:
                    return
                pending = data + more
                continue
            pending = data[cut + 1:]
            offset += cut + 1
            yield data[:cut], offset
            del data


#: Per record kind, the SQL that turns the parsed journal (``lf_raw``: each record
#: as a ``VARCHAR[]`` ``r``, ``i`` its position) into a typed staging table.
_STAGES: dict[str, str] = {
    "T": """SELECT i, r[2] AS key, r[3] AS name, r[4] AS node, r[5] AS item,
                   r[6]::INTEGER AS pos, json_transform(r[7], '["VARCHAR"]') AS upstream,
                   r[8] AS version, r[9]::DOUBLE AS at""",
    "E": """SELECT i, r[2]::BIGINT AS seq, r[3] AS key, r[4]::INTEGER AS attempt,
                   r[5] AS frm, r[6] AS "to", r[7] AS reason, r[8]::DOUBLE AS ts""",
    "A": """SELECT i, r[2] AS key, r[3]::INTEGER AS attempt, r[4] AS outcome,
                   r[5]::DOUBLE AS started, r[6]::DOUBLE AS ended,
                   r[7] AS etype, r[8] AS emsg, r[9] AS tb""",
    "R": """SELECT i, r[2] AS key, r[3]::INTEGER AS attempt, r[4] AS fp,
                   r[5] AS hash, r[6] AS kind, r[7] AS data, r[8] AS uri,
                   r[9]::BIGINT AS size, r[10] AS cached""",
    "L": """SELECT i, r[2] AS key, r[3]::INTEGER AS attempt, r[4] AS direction,
                   r[5] AS uri, r[6] AS hash, r[7] AS attrs""",
    "N": """SELECT i, r[2] AS key, r[3]::INTEGER AS attempt, r[4] AS kind,
                   r[5] AS message, r[6]::DOUBLE AS ts""",
}


def _stage(kind: str) -> str:
    """The typed rows of one record kind in ``lf_raw``."""
    return (f"{_STAGES[kind]} FROM (SELECT rowid AS i, r FROM lf_raw) "
            f"WHERE r[1] = '{kind}'")


#: Per staged kind: the per-task summary of a batch, and the ``tasks`` columns it sets.
_SUMMARIES: dict[str, tuple[str, str]] = {
    "E": ("""SELECT key, arg_max("to", seq) AS state, max(attempt) AS attempts,
                    min(ts) FILTER (WHERE "to" = 'running') AS started_at,
                    arg_max(ts, seq) AS last_at,
                    arg_max(attempt, seq) FILTER (WHERE "to" = 'pending'
                                                  AND frm IS NOT NULL) AS budget_base
              FROM lf_e GROUP BY key""",
          f"""state = coalesce(e.state, tasks.state),
              started_at = coalesce(tasks.started_at, e.started_at),
              ended_at = CASE WHEN e.state IN {TERMINAL_SQL} THEN e.last_at
                              WHEN e.budget_base IS NOT NULL THEN NULL
                              ELSE tasks.ended_at END,
              budget_base = coalesce(e.budget_base, tasks.budget_base)"""),
    "A": ("""SELECT key, max(attempt) AS attempts,
                    arg_max_null(CASE WHEN outcome = 'ok' THEN NULL
                         WHEN outcome IN ('timeout', 'lost', 'cancelled') THEN
                             CASE WHEN coalesce(emsg, '') = '' THEN outcome
                                  ELSE outcome || ': ' || emsg END
                         WHEN coalesce(etype, '') = '' THEN emsg
                         ELSE etype || ': ' || emsg END, i) AS error
             FROM lf_a GROUP BY key""",
          "error = CASE WHEN a.key IS NULL THEN tasks.error ELSE a.error END"),
    "R": ("""SELECT key, arg_max_null(fp, i) AS fp, arg_max_null(hash, i) AS hash,
                    arg_max_null(kind, i) AS kind, arg_max_null(data, i) AS data,
                    arg_max_null(uri, i) AS uri, arg_max_null(size, i) AS size,
                    arg_max_null(cached, i) AS cached, arg_max_null(attempt, i) AS attempt
             FROM lf_r GROUP BY key""",
          ", ".join(f"{col} = CASE WHEN r.key IS NULL THEN tasks.{col} ELSE r.{src} END"
                    for col, src in (("fingerprint", "fp"), ("result_hash", "hash"),
                                     ("result_kind", "kind"), ("result_data", "data"),
                                     ("result_uri", "uri"), ("result_size", "size"),
                                     ("cached_from", "cached"),
                                     ("result_attempt", "attempt")))),
}


def _task_update(kinds: list[str]) -> str:
    """One UPDATE of ``tasks`` from the batch's events, attempts and results."""
    keys = " UNION ".join(f"SELECT key FROM lf_{k.lower()}" for k in kinds)
    joins = " ".join(f"LEFT JOIN ({_SUMMARIES[k][0]}) {k.lower()} ON {k.lower()}.key = k.key"
                     for k in kinds)
    counts = ", ".join(f"coalesce({k.lower()}.attempts, 0)" for k in kinds if k != "R")
    sets = ", ".join(_SUMMARIES[k][1] for k in kinds)
    if counts:
        sets += f", attempts = greatest(tasks.attempts, {counts})"
    return (f"UPDATE tasks SET {sets} FROM ({keys}) k {joins} "
            f"WHERE tasks.run_id = ? AND tasks.task_key = k.key")


def _insert(con: Any, run_id: str, token: int, body: bytes, scratch: Path) -> None:
    """Fold journal lines (``body``: complete lines) into the tables, set-based.

    The lines' records are written out as one JSON array that DuckDB's JSON
    reader streams into ``lf_raw``, one row per record (each a list of text
    fields, ``rowid`` its position): one parse, in bounded memory even for a
    commit of 100,000 task records, and no Arrow conversion (building Arrow
    arrays from Python lists makes pyarrow import pandas). The staging
    queries then only index and cast.
    """
    # every line is a JSON array and JSON text never holds a raw newline, so
    # "]\n[" occurs only between lines: joining the arrays is one replace
    padded = b"\n" + body + b"\n"
    if b"\n[]\n" in padded or b"\n\n" in padded:     # rare: empty commits or lines
        body = b"\n".join(ln for ln in body.split(b"\n") if ln not in (b"", b"[]")) or b"[]"
    del padded
    # every record starts '["K",' (K its kind): a kind absent from the bytes is absent
    # (a false positive, from text inside a string, only costs an empty statement)
    kinds = {k for k in "DHSTEARLN" if b'["' + k.encode() + b'",' in body}
    scratch.parent.mkdir(parents=True, exist_ok=True)
    scratch.write_bytes(body.replace(b"]\n[", b","))
    del body
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE lf_raw AS SELECT json AS r FROM "
                    "read_json($1, format='array', records=false, "
                    "columns={'json': 'VARCHAR[]'})", [str(scratch)])
    finally:
        scratch.unlink(missing_ok=True)
    # the lf_* temp tables are replaced by the next batch and go with the connection
    small = [r for (r,) in con.execute(
        "SELECT r FROM lf_raw WHERE r[1] IN ('D', 'H', 'S') ORDER BY rowid").fetchall()] \
        if kinds & {"D", "H", "S"} else []
    _insert_small(con, run_id, token, small)
    if "T" in kinds:
        # no primary key on tasks: DuckDB keeps ART indexes in memory, ~2 KB a row
        con.execute("INSERT INTO tasks (run_id, task_key, task_name, node, item_key, "
                    "position, upstream, code_version, state, attempts, budget_base) "
                    f"SELECT ?, key, name, node, item, pos, upstream, version, 'pending', "
                    f"0, 0 FROM ({_stage('T')}) WHERE key NOT IN "
                    "(SELECT task_key FROM tasks WHERE run_id = ?)", [run_id, run_id])
    staged = [k for k in "EAR" if k in kinds]
    for k in staged:
        con.execute(f"CREATE OR REPLACE TEMP TABLE lf_{k.lower()} AS {_stage(k)}")
    if "E" in kinds:
        con.execute('INSERT INTO events SELECT ?, seq, key, attempt, frm, "to", reason, '
                    "ts, ? FROM lf_e", [run_id, token])
        con.execute("UPDATE runs SET max_seq = greatest(coalesce(max_seq, 0), "
                    "(SELECT max(seq) FROM lf_e)) WHERE run_id = ?", [run_id])
    if "A" in kinds:
        con.execute("INSERT INTO attempts SELECT ?, key, attempt, outcome, started, "
                    "ended, etype, emsg, tb, ? FROM lf_a", [run_id, token])
    if "R" in kinds:
        con.execute("INSERT INTO results SELECT ?, key, attempt, fp, hash, kind, data, "
                    "uri, size, cached FROM lf_r", [run_id])
    if staged:
        con.execute(_task_update(staged), [run_id])
    if "L" in kinds:
        con.execute("INSERT INTO artifacts SELECT ?, key, attempt, direction, uri, hash, "
                    f"attrs FROM ({_stage('L')})", [run_id])
    if "N" in kinds:
        con.execute("INSERT INTO notices SELECT ?, key, attempt, kind, message, ts "
                    f"FROM ({_stage('N')})", [run_id])
    for _, state, reason, at in [r for r in small if r[0] == "S"][-1:]:
        ended = float(at) if state in ("succeeded", "failed", "cancelled") else None
        con.execute("UPDATE runs SET state = ?, reason = ?, ended_at = ? WHERE run_id = ?",
                    [state, reason, ended, run_id])


def _insert_small(con: Any, run_id: str, token: int, records: list[Any]) -> None:
    for rec in records:
        if rec[0] == "D":
            _, rid, pipe, target, params, created, options = rec
            created = float(created)
            con.execute("INSERT INTO runs (run_id, pipeline, target, params, options, state, "
                        "created_at, token, max_seq) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, 0) "
                        "ON CONFLICT DO NOTHING",
                        [rid, pipe, target, params, options, created, token])
        elif rec[0] == "H":
            _, htoken, pid, host, _at = rec
            htoken, pid = int(htoken), int(pid)
            con.execute("UPDATE runs SET token = greatest(coalesce(token, 0), ?), "
                        "driver_pid = ?, driver_host = ? WHERE run_id = ?",
                        [htoken, pid, host, run_id])


@hookimpl
def ledgerflow_store_names() -> list[str]:
    return ["duckdb"]


@hookimpl
def ledgerflow_make_store(name: str, settings: Settings) -> DuckDBStore | None:
    if name != "duckdb":
        return None
    return DuckDBStore(settings.store)


