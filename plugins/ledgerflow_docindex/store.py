"""The doc index file: its tables, and safe access to it from many threads and processes.

Tables:

``chunks``
    one row per chunk, keyed by ``(doc_id, position)``: the text, its
    ``content_hash``, the document's ``doc_hash``, the embedding
    (``FLOAT[dim]``) with its ``embed_key`` (see :func:`embed_key`), the
    embedder name and version, and the provenance of the write (``run_id``,
    ``task_key``, ``attempt``, ``written_at``).
``postings``
    ``(doc_id, position, term, tf)``: the keyword index used by BM25,
    maintained in the same transaction as ``chunks``.
``writes``
    one row per applied document write, keyed by the task's idempotency key.
``meta``
    ``schema_version``, ``embedder``, ``embedder_version``, ``dim`` and
    ``index_id``: an index holds vectors of exactly one embedder.

Concurrency: DuckDB lets one process at a time open a file read-write (a
second process cannot open it at all), and, inside a process, concurrent
transactions that touch the same rows conflict. Every operation here runs
one short transaction on a connection that is open only while the process
has work for the index (threads of one process share it), queues behind
other processes with a file lock on ``INDEX.lock`` (``filelock``), and
retries conflicting transactions with jittered exponential backoff
(``LEDGERFLOW_INDEX_LOCK_TIMEOUT`` seconds in all, default 60).

Beside the index, ``INDEX.embeddings.sqlite`` is its chunk-level embedding
cache (:class:`EmbeddingCache`): SQLite, because every embedding step of every
worker process reads and writes it, and SQLite opens in well under a
millisecond and lets many processes in at once, where a DuckDB file costs
about 20 ms to open and admits one process at a time.
"""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb
import pyarrow as pa

from ledgerflow.errors import PipelineError

from .terms import keyword_terms

if TYPE_CHECKING:
    import numpy as np
    from filelock import BaseFileLock

#: 2 added ``chunks.embed_key`` (a version 1 index is upgraded in place when a run
#: opens it).
SCHEMA_VERSION = 2
T = TypeVar("T")

__all__ = [
    "SCHEMA_VERSION", "ChunkNotFoundError", "DocIndexError", "EmbeddingCache",
    "IndexLockedError", "IndexMismatchError", "IndexNotFoundError", "Provenance",
    "WriteResult", "bulk_writer", "connect", "delete_documents", "document_digests",
    "embed_key", "embedding_cache", "explain", "index_info", "keyword_terms", "open_index",
    "payload_hash", "prune_index", "read_meta", "table_digest", "transaction",
    "vectors_schema", "write_document",
]


def vectors_schema(dim: int) -> pa.Schema:
    """Arrow schema of a document's embedded chunks, as ``embed`` returns them.

    ``embedding`` is a fixed-size list of ``dim`` float32.
    """
    return pa.schema([
        ("doc_id", pa.string()), ("doc_hash", pa.string()), ("source", pa.string()),
        ("position", pa.int32()), ("start_char", pa.int32()), ("end_char", pa.int32()),
        ("text", pa.string()), ("content_hash", pa.string()),
        ("embedding", pa.list_(pa.float32(), dim)),
        ("embedder", pa.string()), ("embedder_version", pa.string()),
        ("embed_key", pa.string()),
    ])


def embed_key(embedder: str, version: str, text: str) -> str:
    """The embedding cache's key of one embedder input: SHA-256 of the embedder and the text.

    ``text`` is exactly what the embedder is given, so equal keys always mean
    equal vectors; a new model version gives new keys.
    """
    return hashlib.sha256(f"{embedder}\0{version}\0{text}".encode()).hexdigest()


class DocIndexError(PipelineError):
    """Base of the index errors (a cause and a ``hint``, like every ledgerflow error)."""

    default_hint = "check the index path, or build the index with the doc_index pipeline"


class IndexNotFoundError(DocIndexError, FileNotFoundError):
    """The index file does not exist."""

    default_hint = ("build it first: pipeline run recipes/doc_index/pipeline.py "
                    "-p source=DOCS -p index=INDEX")


class IndexLockedError(DocIndexError, TimeoutError):
    """The index stayed locked by another process (or conflicting) for too long."""

    default_hint = ("wait for the process using the index, or raise "
                    "LEDGERFLOW_INDEX_LOCK_TIMEOUT (seconds)")


class IndexMismatchError(DocIndexError, ValueError):
    """The index was built with another embedder (or vector size) than the one given."""

    default_hint = "use the embedder the index was built with, or a new index path"


class ChunkNotFoundError(DocIndexError, LookupError):
    """No chunk with that ``(doc_id, position)`` is in the index."""

    default_hint = "pass a position the document has (see the search hits)"


@dataclass(frozen=True, slots=True)
class Provenance:
    """Who writes: the run, task and attempt, and the task's idempotency key.

    ``run_id == "local"`` (a plain call outside a run) disables the
    skip-if-already-written check; the write itself is idempotent anyway.
    """

    run_id: str = "local"
    task_key: str = "local"
    attempt: int = 1
    idempotency_key: str = "local"


# --------------------------------------------------------------------------- connections
#
# DuckDB allows one process at a time to open a file read-write, and two
# threads of one process racing to open (or close) the same file can see a
# half-initialised database. So, per index file and per process, the file is
# open at most once (a *handle*); threads that need the index at the same time
# share it through their own cursors, and the last one out closes it. Between
# processes, a file lock (``INDEX.lock``, filelock) queues the openers instead
# of letting them spin on DuckDB's lock error. A handle admits new users only
# for ``HOLD_SECONDS`` after it was opened; then it is closed as soon as its
# users finish, so that waiting processes get their turn.
#
# "Open" is an ``ATTACH`` of the file to one in-memory DuckDB database that the
# process keeps, and "close" a ``DETACH``: that releases the file to other
# processes just as closing a connection does, for about 1 ms instead of the
# ~15-25 ms of starting and stopping a DuckDB database per piece of work (a run
# writes the index once per document).
#
# All of this state belongs to one process: it is looked up by process id, so a
# child forked at any moment (a lock held by another thread, an index attached)
# starts with state of its own instead of inheriting locked locks and handles.

#: How long a process may keep admitting new users to an open index.
HOLD_SECONDS = 0.25


def _lock_timeout() -> float:
    return float(os.environ.get("LEDGERFLOW_INDEX_LOCK_TIMEOUT", "60"))


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    if type(exc).__name__ == "ResourceInUseException":   # open elsewhere in this process
        return True
    return isinstance(exc, duckdb.IOException) and ("lock" in text or "resource" in text)


def _is_conflict(exc: BaseException) -> bool:
    if isinstance(exc, duckdb.TransactionException):
        return True
    text = str(exc).lower()
    return isinstance(exc, duckdb.ConstraintException) and "duplicate key" in text


@dataclass(slots=True)
class _Handle:
    """This process's attachment of one index file (see the notes above)."""

    path: str
    alias: str = ""
    users: int = 1
    con: duckdb.DuckDBPyConnection | None = None   # the in-memory root; cursors USE alias
    lock: BaseFileLock | None = None
    opened: float = 0.0


@dataclass(slots=True)
class _Process:
    """The handles of one process, their condition, and its in-memory DuckDB database."""

    pid: int
    handles: dict[str, _Handle] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    root_lock: threading.Lock = field(default_factory=threading.Lock)  # uses of root
    root: duckdb.DuckDBPyConnection | None = None


_state = _Process(os.getpid())
#: The parent's state in a forked child: kept, never used, never freed (freeing its
#: DuckDB database would stop threads that do not exist in the child).
_inherited: list[_Process] = []


def _here() -> _Process:
    """This process's state (new in a child that was forked from another process)."""
    global _state
    state = _state
    if state.pid != os.getpid():
        _inherited.append(state)
        state = _state = _Process(os.getpid())
    return state


def _attach(path: str, alias: str) -> duckdb.DuckDBPyConnection:
    state = _here()
    quoted = path.replace("'", "''")
    with state.root_lock:
        if state.root is None:
            state.root = duckdb.connect(":memory:")
        state.root.execute(f"ATTACH '{quoted}' AS {alias}")
        return state.root


def _detach(root: duckdb.DuckDBPyConnection, alias: str) -> None:
    with _here().root_lock:
        root.execute(f"DETACH {alias}")


def file_lock(path: str, deadline: float, what: str = "the index") -> BaseFileLock:
    """Take the file lock ``path`` (waiting until ``deadline``, a monotonic time).

    Not tied to a thread: the thread that releases it may differ from the
    one that took it (the last user of a shared handle closes it).

    Raises:
        IndexLockedError: another process held it until the deadline.
    """
    from filelock import FileLock, Timeout

    lock = FileLock(path, thread_local=False)
    try:
        lock.acquire(timeout=max(0.0, deadline - time.monotonic()), poll_interval=0.005)
    except Timeout:
        raise IndexLockedError(
            f"could not lock {path}: another process kept {what} busy for "
            f"{_lock_timeout():.0f}s (LEDGERFLOW_INDEX_LOCK_TIMEOUT)") from None
    return lock


def _acquire(path: str, deadline: float) -> _Handle:
    """Join this process's open handle of ``path``, or open one."""
    pause = 0.0
    state = _here()
    with state.cond:
        while True:
            handle = state.handles.get(path)
            if handle is None:
                handle = state.handles[path] = _Handle(path)
                break
            if handle.con is not None and time.monotonic() - handle.opened < HOLD_SECONDS:
                handle.users += 1
                return handle
            if handle.con is not None:
                pause = 0.02  # it expired: let other processes in before reopening
            if time.monotonic() > deadline:
                raise IndexLockedError(f"could not open {path}: timed out waiting for "
                                       "other threads of this process")
            state.cond.wait(timeout=0.05)
    try:
        if pause:
            time.sleep(pause * random.random())
        handle.lock = file_lock(path + ".lock", deadline)
        handle.alias = "index_" + hashlib.sha256(path.encode()).hexdigest()[:16]
        try:
            handle.con = _retry(lambda: _attach(path, handle.alias),
                                deadline - time.monotonic(), f"open {path}", lock_only=True)
        except duckdb.Error as exc:
            handle.lock.release()
            raise IndexMismatchError(f"cannot open {path} as an index: {exc}",
                                     hint="pass the path of a doc_index index, or a new "
                                          "path") from exc
        except BaseException:
            handle.lock.release()
            raise
    except BaseException:
        with state.cond:
            del state.handles[path]
            state.cond.notify_all()
        raise
    with state.cond:
        handle.opened = time.monotonic()
        state.cond.notify_all()
    return handle


def _release(handle: _Handle) -> None:
    """Leave the handle; the last user closes the file and releases the lock."""
    state = _here()
    with state.cond:
        handle.users -= 1
        if handle.users:
            return
        try:
            if handle.con is not None:
                _detach(handle.con, handle.alias)
        finally:
            if handle.lock is not None:
                handle.lock.release()
            del state.handles[handle.path]
            state.cond.notify_all()


@contextmanager
def connect(index: str | os.PathLike[str], *, create: bool = True,
            timeout: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the index file for a short piece of work (see the notes above).

    Waits (with backoff) while another process has the file open. The
    connection is a cursor of this process's shared handle: do not keep it.

    Raises:
        IndexNotFoundError: ``create=False`` and the file does not exist.
        IndexLockedError: still busy after ``timeout`` seconds
            (default ``LEDGERFLOW_INDEX_LOCK_TIMEOUT``, 60).
    """
    path = Path(index)
    if not create and not path.exists():
        raise IndexNotFoundError(
            f"index {str(index)!r} does not exist",
            hint=f"build it first, e.g. pipeline run recipes/doc_index/pipeline.py "
                 f"-p source=DOCS -p index={index}")
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + (_lock_timeout() if timeout is None else timeout)
    handle = _acquire(str(path.resolve()), deadline)
    try:
        assert handle.con is not None
        with _here().root_lock:
            cursor = handle.con.cursor()
        try:
            cursor.execute(f"USE {handle.alias}")
            yield cursor
        finally:
            cursor.close()
    finally:
        _release(handle)


def _retry(fn: Callable[[], T], timeout: float | None, what: str, *,
           lock_only: bool = False) -> T:
    """Call ``fn``, retrying lock errors (and conflicts unless ``lock_only``) with backoff."""
    deadline = time.monotonic() + (_lock_timeout() if timeout is None else timeout)
    delay = 0.005
    while True:
        try:
            return fn()
        except duckdb.Error as exc:
            retryable = _is_lock_error(exc) or (not lock_only and _is_conflict(exc))
            if not retryable:
                raise
            if time.monotonic() + delay > deadline:
                raise IndexLockedError(
                    f"could not {what}: still locked or conflicting after retrying "
                    f"({exc}); another process may hold the index open") from exc
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)


def transaction(index: str | os.PathLike[str], fn: Callable[[duckdb.DuckDBPyConnection], T],
                *, create: bool = True, timeout: float | None = None) -> T:
    """Run ``fn(con)`` in one transaction on a fresh connection; retry locks and conflicts."""
    def attempt() -> T:
        with connect(index, create=create, timeout=timeout) as con:
            con.execute("BEGIN TRANSACTION")
            try:
                result = fn(con)
                con.execute("COMMIT")
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:
                    pass  # a failed COMMIT already ended the transaction
                raise
            return result

    return _retry(attempt, timeout, f"write {index}")


# --------------------------------------------------------------------------- schema


def _create_schema(con: duckdb.DuckDBPyConnection, dim: int) -> None:
    con.execute("CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
    con.execute(f"""
        CREATE TABLE IF NOT EXISTS chunks (
            doc_id VARCHAR NOT NULL, position INTEGER NOT NULL, text VARCHAR NOT NULL,
            content_hash VARCHAR NOT NULL, doc_hash VARCHAR NOT NULL, source VARCHAR,
            start_char INTEGER, end_char INTEGER, n_terms INTEGER NOT NULL,
            embedding FLOAT[{int(dim)}] NOT NULL, embedder VARCHAR NOT NULL,
            embedder_version VARCHAR NOT NULL, run_id VARCHAR NOT NULL,
            task_key VARCHAR NOT NULL, attempt INTEGER NOT NULL, written_at TIMESTAMP NOT NULL,
            embed_key VARCHAR, PRIMARY KEY (doc_id, position))""")
    con.execute("""
        CREATE TABLE IF NOT EXISTS postings (
            doc_id VARCHAR NOT NULL, position INTEGER NOT NULL, term VARCHAR NOT NULL,
            tf INTEGER NOT NULL)""")
    con.execute("""
        CREATE TABLE IF NOT EXISTS writes (
            idempotency_key VARCHAR PRIMARY KEY, doc_id VARCHAR NOT NULL,
            doc_hash VARCHAR NOT NULL, payload_hash VARCHAR NOT NULL, chunks INTEGER NOT NULL,
            run_id VARCHAR NOT NULL, task_key VARCHAR NOT NULL, attempt INTEGER NOT NULL,
            written_at TIMESTAMP NOT NULL)""")


def _upgrade(con: duckdb.DuckDBPyConnection, meta: dict[str, str]) -> None:
    """Bring a version 1 index to version 2 (in the caller's transaction)."""
    if meta.get("schema_version") == "1":
        con.execute("ALTER TABLE chunks ADD COLUMN embed_key VARCHAR")
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                    [str(SCHEMA_VERSION)])
        meta["schema_version"] = str(SCHEMA_VERSION)


def read_meta(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Return the ``meta`` table as a dict (empty for a new or foreign file)."""
    exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = "
                         "current_database() AND schema_name = 'main' AND table_name = 'meta'"
                         ).fetchall()[0][0]
    if not exists:
        return {}
    return dict(con.execute("SELECT key, value FROM meta").fetchall())


def _check_or_set_meta(con: duckdb.DuckDBPyConnection, embedder: str, version: str,
                       dim: int, index: str) -> dict[str, str]:
    """Create the schema of a new file, or check an index's embedder; return ``meta``."""
    meta = read_meta(con)
    if not meta:
        others = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = "
                             "current_database()").fetchall()[0][0]
        if others:
            raise IndexMismatchError(
                f"{index!r} is a DuckDB file with other tables, not a doc_index index",
                hint="pass a new index path")
        _create_schema(con, dim)
        created = {"schema_version": str(SCHEMA_VERSION), "embedder": embedder,
                   "embedder_version": version, "dim": str(dim)}
        con.executemany("INSERT INTO meta VALUES (?, ?)", list(created.items()))
        return created
    if int(meta.get("schema_version", "0")) > SCHEMA_VERSION:
        raise IndexMismatchError(
            f"index {index!r} has schema version {meta['schema_version']}, newer than this "
            f"recipe ({SCHEMA_VERSION})", hint="upgrade ledgerflow or use a new index path")
    if (meta.get("embedder"), meta.get("embedder_version"), meta.get("dim")) != (
            embedder, version, str(dim)):
        raise IndexMismatchError(
            f"index {index!r} was built with embedder {meta.get('embedder')!r} "
            f"(version {meta.get('embedder_version')}, dim {meta.get('dim')}), not "
            f"{embedder!r} (version {version}, dim {dim}); pass embedder="
            f"{meta.get('embedder')} or write to a new index path")
    _upgrade(con, meta)
    return meta


def open_index(index: str | os.PathLike[str], embedder: str, version: str, dim: int, *,
               timeout: float | None = None) -> dict[str, Any]:
    """Create the index if needed, check its embedder, and return its identity.

    Returns ``{"index", "index_id", "embedder", "embedder_version", "dim"}``.
    ``index_id`` is a random id stored in the file when it is created: a
    deleted or replaced index file gets a new one, which is how the pipeline
    notices that previously written documents must be written again.

    Raises:
        IndexMismatchError: the index holds another embedder's vectors.
    """
    def apply(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
        _check_or_set_meta(con, embedder, version, dim, str(index))
        found = con.execute("SELECT value FROM meta WHERE key = 'index_id'").fetchall()
        if found:
            index_id = found[0][0]
        else:
            index_id = uuid.uuid4().hex
            con.execute("INSERT INTO meta VALUES ('index_id', ?)", [index_id])
        return {"index": str(index), "index_id": index_id, "embedder": embedder,
                "embedder_version": version, "dim": dim}

    return transaction(index, apply, timeout=timeout)


# --------------------------------------------------------------------------- writes


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What :func:`write_document` did."""

    doc_id: str | None
    doc_hash: str | None
    chunks: int
    inserted: int
    deleted: int
    skipped: bool  # the same idempotency key was already applied

    def as_dict(self) -> dict[str, Any]:
        """The deterministic part, JSON-able (a task result must not depend on retries)."""
        return {"doc_id": self.doc_id, "doc_hash": self.doc_hash, "chunks": self.chunks}


def payload_hash(table: pa.Table) -> str:
    """Hash of what a write would store (positions, chunk hashes, doc hash, embedder)."""
    h = hashlib.sha256()
    cols = [table.column(c).to_pylist() for c in
            ("position", "content_hash", "doc_hash", "embedder_version")]
    for row in zip(*cols, strict=True):
        h.update(repr(row).encode())
    return h.hexdigest()


def write_document(index: str | os.PathLike[str], table: pa.Table, *,
                   provenance: Provenance | None = None, index_id: str | None = None,
                   timeout: float | None = None) -> WriteResult:
    """Replace one document's chunks in the index, in one short transaction.

    ``table`` holds all chunks of one document (schema :func:`vectors_schema`).
    Rows are keyed by ``(doc_id, position, content_hash, embed_key)``: chunks
    whose text (and embedder input) did not change keep their row (and the provenance of the write that created it),
    changed or new positions are written, positions the document no longer has
    are deleted, and the keyword postings follow in the same transaction.

    The write is idempotent: applying the same table twice leaves the same
    rows. In a run, the task's idempotency key is recorded in ``writes`` in the
    same transaction, so a retry after a crash that happened after the commit
    (but before the ledger recorded success) is recognised and skipped.

    An empty table carries no ``doc_id`` unless its schema metadata has one
    (``b"doc_id"``); then the document's rows are removed. Otherwise nothing
    happens (``prune`` removes stale rows by document hash).

    ``index_id`` (from :func:`open_index`), when given, must still be the
    file's id: a write never lands in an index that replaced the one opened.

    Raises:
        IndexMismatchError: the index holds another embedder's vectors, was
            replaced since :func:`open_index`, or ``table`` mixes documents or
            embedders.
        IndexLockedError: the index stayed locked too long.
    """
    index = str(index)
    apply = _document_writer(index, table, provenance or Provenance(), index_id)
    if isinstance(apply, WriteResult):  # nothing to write
        return apply
    return transaction(index, apply, timeout=timeout)


def _document_writer(index: str, table: pa.Table, prov: Provenance, index_id: str | None
                     ) -> Callable[[duckdb.DuckDBPyConnection], WriteResult] | WriteResult:
    """Check ``table``; return the transaction body that writes it (see write_document).

    Returns a WriteResult instead when there is nothing to write (an empty
    table without a ``doc_id``, or for an index that does not exist).
    """
    table = _normalise_table(table)
    doc_ids = set(table.column("doc_id").to_pylist())
    if len(doc_ids) > 1:
        raise IndexMismatchError(f"write_document takes one document, given {sorted(doc_ids)}")
    if table.num_rows == 0:
        meta = table.schema.metadata or {}
        empty_id = meta.get(b"doc_id", b"").decode() or None
        empty_hash = (meta.get(b"doc_hash") or b"").decode() or None
        if empty_id is None or not Path(index).exists():
            return WriteResult(empty_id, empty_hash, 0, 0, 0, False)

        def remove(con: duckdb.DuckDBPyConnection) -> WriteResult:
            deleted = _delete_rows(con, [empty_id])
            return WriteResult(empty_id, empty_hash, 0, 0, deleted, False)

        return remove
    embedders = set(zip(table.column("embedder").to_pylist(),
                        table.column("embedder_version").to_pylist(), strict=True))
    if len(embedders) > 1:
        raise IndexMismatchError(f"one write mixes embedders: {sorted(embedders)}")
    (embedder, version), = embedders
    dim = table.schema.field("embedding").type.list_size
    doc_id = next(iter(doc_ids))
    doc_hash = table.column("doc_hash")[0].as_py()
    payload = payload_hash(table)
    in_run = prov.run_id != "local"
    key = prov.idempotency_key if in_run else f"local:{doc_id}"

    def apply(con: duckdb.DuckDBPyConnection) -> WriteResult:
        meta = _check_or_set_meta(con, embedder, version, dim, index)
        if index_id is not None and meta.get("index_id") != index_id:
            raise IndexMismatchError(
                f"index {index!r} was deleted or replaced during the run",
                hint="run the pipeline again")
        done = con.execute("SELECT payload_hash FROM writes WHERE idempotency_key = ?",
                           [key]).fetchall()
        if in_run and done and done[0][0] == payload:
            return WriteResult(doc_id, doc_hash, table.num_rows, 0, 0, True)
        # a row is kept when its text and what was embedded for it are unchanged
        existing = {p: (h, k) for p, h, k in con.execute(
            "SELECT position, content_hash, embed_key FROM chunks WHERE doc_id = ?",
            [doc_id]).fetchall()}
        positions = table.column("position").to_pylist()
        hashes = list(zip(table.column("content_hash").to_pylist(),
                          table.column("embed_key").to_pylist(), strict=True))
        incoming = dict(zip(positions, hashes, strict=True))
        stale = [p for p, h in existing.items() if incoming.get(p) != h]
        fresh = [i for i, (p, h) in enumerate(zip(positions, hashes, strict=True))
                 if existing.get(p) != h]
        if stale:
            con.execute("DELETE FROM chunks WHERE doc_id = ? AND list_contains(?, position)",
                        [doc_id, stale])
            con.execute("DELETE FROM postings WHERE doc_id = ? AND list_contains(?, position)",
                        [doc_id, stale])
        kept = len(existing) - len(stale)
        if kept:  # unchanged chunks: follow the document's new hash and offsets
            con.register("incoming_all", table)
            con.execute("""
                UPDATE chunks SET doc_hash = i.doc_hash, source = i.source,
                       start_char = i.start_char, end_char = i.end_char
                FROM incoming_all i
                WHERE chunks.doc_id = i.doc_id AND chunks.position = i.position
                  AND (chunks.doc_hash <> i.doc_hash OR chunks.start_char <> i.start_char
                       OR chunks.source IS DISTINCT FROM i.source)""")
            con.unregister("incoming_all")
        if fresh:
            new_rows = table.take(pa.array(fresh, pa.int64()))
            postings, lengths = _postings(new_rows)
            con.register("incoming", new_rows.append_column("n_terms", lengths))
            con.register("incoming_postings", postings)
            con.execute("""
                INSERT INTO chunks (doc_id, position, text, content_hash, doc_hash, source,
                                    start_char, end_char, n_terms, embedding, embedder,
                                    embedder_version, run_id, task_key, attempt, written_at,
                                    embed_key)
                SELECT doc_id, position, text, content_hash, doc_hash, source, start_char,
                       end_char, n_terms, embedding, embedder, embedder_version,
                       ?, ?, ?, current_timestamp AT TIME ZONE 'UTC', embed_key
                FROM incoming""", [prov.run_id, prov.task_key, prov.attempt])
            con.execute("INSERT INTO postings SELECT * FROM incoming_postings")
            con.unregister("incoming")
            con.unregister("incoming_postings")
        if done:   # the same key again (a retry that wrote something else, a local write)
            con.execute("DELETE FROM writes WHERE idempotency_key = ?", [key])
        con.execute("""
            INSERT INTO writes VALUES
                (?, ?, ?, ?, ?, ?, ?, ?, current_timestamp AT TIME ZONE 'UTC')""",
                    [key, doc_id, doc_hash, payload, table.num_rows, prov.run_id,
                     prov.task_key, prov.attempt])
        return WriteResult(doc_id, doc_hash, table.num_rows, len(fresh), len(stale), False)

    return apply


def _postings(rows: pa.Table) -> tuple[pa.Table, pa.Array]:
    """Postings ``(doc_id, position, term, tf)`` of chunk rows, and each row's term count."""
    cols: dict[str, list[Any]] = {"doc_id": [], "position": [], "term": [], "tf": []}
    lengths = []
    for doc_id, position, text in zip(rows.column("doc_id").to_pylist(),
                                      rows.column("position").to_pylist(),
                                      rows.column("text").to_pylist(), strict=True):
        terms = keyword_terms(doc_id, text)
        lengths.append(len(terms))
        for term, tf in Counter(terms).items():
            cols["doc_id"].append(doc_id)
            cols["position"].append(position)
            cols["term"].append(term)
            cols["tf"].append(tf)
    table = pa.table({"doc_id": pa.array(cols["doc_id"], pa.string()),
                      "position": pa.array(cols["position"], pa.int32()),
                      "term": pa.array(cols["term"], pa.string()),
                      "tf": pa.array(cols["tf"], pa.int32())})
    return table, pa.array(lengths, pa.int32())


def _normalise_table(table: pa.Table) -> pa.Table:
    """Check the columns; cast to :func:`vectors_schema` (order and types)."""
    if not isinstance(table, pa.Table):
        raise TypeError(f"expected a pyarrow.Table of embedded chunks, given {type(table)}")
    try:
        dim = table.schema.field("embedding").type.list_size
    except KeyError:
        raise ValueError("the table has no 'embedding' column") from None
    schema = vectors_schema(dim)
    if "embed_key" not in table.schema.names:  # optional: rows without one are not cached
        table = table.append_column("embed_key", pa.nulls(table.num_rows, pa.string()))
    missing = [n for n in schema.names if n not in table.schema.names]
    if missing:
        raise ValueError(f"the table lacks the columns {missing}")
    cast = table.select(schema.names).cast(schema)
    return cast.replace_schema_metadata(table.schema.metadata)


def delete_documents(index: str | os.PathLike[str], doc_ids: Iterable[str], *,
                     timeout: float | None = None) -> int:
    """Remove every chunk of ``doc_ids``; return the number of chunks removed."""
    ids = sorted(set(doc_ids))
    if not ids:
        return 0

    return transaction(index, lambda con: _delete_rows(con, ids), timeout=timeout)


def _delete_rows(con: duckdb.DuckDBPyConnection, ids: list[str]) -> int:
    if not read_meta(con):
        return 0
    n = con.execute("SELECT count(*) FROM chunks WHERE list_contains(?, doc_id)",
                    [ids]).fetchall()[0][0]
    for table in ("chunks", "postings", "writes"):
        con.execute(f"DELETE FROM {table} WHERE list_contains(?, doc_id)", [ids])
    return int(n)


class BulkWriter:
    """Many document writes on one open connection (see :func:`bulk_writer`)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, index: str) -> None:
        self._con = con
        self.index = index

    def write(self, table: pa.Table, *, provenance: Provenance | None = None,
              index_id: str | None = None) -> WriteResult:
        """Like :func:`write_document`, one transaction, without reopening the file."""
        apply = _document_writer(self.index, table, provenance or Provenance(), index_id)
        if isinstance(apply, WriteResult):
            return apply
        body = apply

        def attempt() -> WriteResult:
            self._con.execute("BEGIN TRANSACTION")
            try:
                result = body(self._con)
                self._con.execute("COMMIT")
            except BaseException:
                with suppress(duckdb.Error):
                    self._con.execute("ROLLBACK")
                raise
            return result

        return _retry(attempt, None, f"write {self.index}")


@contextmanager
def bulk_writer(index: str | os.PathLike[str], *,
                timeout: float | None = None) -> Iterator[BulkWriter]:
    """Keep the index open for a series of writes from one thread (scripts, bulk loads).

    Saves the ~20 ms open/close of each :func:`write_document`; other processes
    (and other threads of this one) wait until the block ends. Do not call the
    other functions of this module on the same index inside the block.

    Example:
        >>> with bulk_writer("index.duckdb") as w:  # doctest: +SKIP
        ...     for table in tables:
        ...         w.write(table)
    """
    with connect(index, timeout=timeout) as con:
        yield BulkWriter(con, str(index))


#: How long the embedding cache keeps vectors that no chunk of the index holds (a
#: revert within that time embeds nothing; a run still embedding keeps its work).
PENDING_EMBEDDINGS_HOURS = 24


def prune_index(index: str | os.PathLike[str], docs: Iterable[Mapping[str, Any]], *,
                timeout: float | None = None) -> dict[str, Any]:
    """Delete the chunks of documents that are gone or stale; return counts.

    ``docs`` is the current document list (``doc_id`` and ``content_hash``, as
    from ``discover``). A chunk is removed when its document is not listed
    (deleted file) or when its ``doc_hash`` differs from the listed hash (the
    file changed and its new version wrote no rows at that position, e.g. it
    became empty). Their ``writes`` records go too, and the embedding cache
    forgets the vectors older than :data:`PENDING_EMBEDDINGS_HOURS` that no
    chunk holds. A missing index file is left missing.
    """
    current = {d["doc_id"]: d["content_hash"] for d in docs}
    result = {"index": str(index), "documents": len(current), "chunks": 0,
              "deleted_documents": [], "deleted_chunks": 0}
    if not Path(index).exists():
        return result
    keep = pa.table({"doc_id": pa.array(list(current), pa.string()),
                     "doc_hash": pa.array(list(current.values()), pa.string())})
    cache = EmbeddingCache(str(index))
    cutoff = time.time() - PENDING_EMBEDDINGS_HOURS * 3600
    collect_keys = cache.count_older(cutoff) > 0   # usually none: skip reading every key
    referenced: list[str] = []

    def apply(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
        referenced.clear()
        if not read_meta(con):
            return result
        con.register("current_docs", keep)
        con.execute("""
            CREATE OR REPLACE TEMP TABLE stale_chunks AS
            SELECT c.doc_id, c.position, k.doc_id IS NULL AS gone
            FROM chunks c LEFT JOIN current_docs k ON c.doc_id = k.doc_id
            WHERE k.doc_id IS NULL OR c.doc_hash <> k.doc_hash""")
        stale = con.execute("SELECT doc_id, gone FROM stale_chunks").fetchall()
        gone = sorted({doc for doc, is_gone in stale if is_gone})
        if stale:
            for table in ("chunks", "postings"):
                con.execute(f"""DELETE FROM {table} WHERE EXISTS (
                    SELECT 1 FROM stale_chunks s
                    WHERE s.doc_id = {table}.doc_id AND s.position = {table}.position)""")
        con.execute("DROP TABLE stale_chunks")
        con.execute("DELETE FROM writes WHERE NOT EXISTS (SELECT 1 FROM current_docs k "
                    "WHERE k.doc_id = writes.doc_id AND k.doc_hash = writes.doc_hash)")
        con.unregister("current_docs")
        if collect_keys:
            referenced.extend(k for (k,) in con.execute(
                "SELECT DISTINCT embed_key FROM chunks WHERE embed_key IS NOT NULL").fetchall())
        total = con.execute("SELECT count(*) FROM chunks").fetchall()[0][0]
        return {**result, "chunks": int(total), "deleted_documents": gone,
                "deleted_chunks": len(stale)}

    pruned = transaction(index, apply, timeout=timeout)
    if collect_keys:
        cache.forget_unused(referenced, cutoff)
    return pruned


# --------------------------------------------------------------------------- embedding cache


class EmbeddingCache:
    """The index's chunk-level embedding cache: vectors by :func:`embed_key`.

    A SQLite file beside the index (``INDEX.embeddings.sqlite``; WAL mode, so
    readers and one writer of any process go on together). Every vector the
    pipeline embeds is kept; :func:`prune_index` forgets those that no chunk
    holds after :data:`PENDING_EMBEDDINGS_HOURS`. Losing the file loses
    nothing but time: vectors are embedded again.

    For the look-up / embed / store step of :func:`embedding_cache`, which
    makes it one step for all processes, use that function.
    """

    def __init__(self, index: str, timeout: float | None = None) -> None:
        self.path = f"{Path(index).resolve()}.embeddings.sqlite"
        self._timeout = _lock_timeout() if timeout is None else timeout

    def _connect(self, create: bool) -> sqlite3.Connection | None:
        if not create and not os.path.exists(self.path):
            return None
        con = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")   # a lost entry is only embedded again
        if create:
            con.execute("""CREATE TABLE IF NOT EXISTS embeddings (
                embed_key TEXT PRIMARY KEY, dim INTEGER NOT NULL, vector BLOB NOT NULL,
                created_at REAL NOT NULL) WITHOUT ROWID""")
        return con

    def lookup(self, keys: Sequence[str], dim: int) -> dict[str, np.ndarray]:
        """The cached ``dim``-vectors of ``keys`` (those found), each a float32 array."""
        import numpy as np

        wanted = sorted(set(keys))
        con = self._connect(create=False) if wanted else None
        if con is None:
            return {}
        out: dict[str, np.ndarray] = {}
        try:
            for start in range(0, len(wanted), 500):   # SQLite's bound on parameters
                part = wanted[start:start + 500]
                rows = con.execute(
                    "SELECT embed_key, vector FROM embeddings WHERE dim = ? AND embed_key IN "
                    f"({','.join('?' * len(part))})", [dim, *part]).fetchall()
                for key, blob in rows:
                    out[key] = np.frombuffer(blob, dtype=np.float32)
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return {}
            raise
        finally:
            con.close()
        return out

    def store(self, keys: Sequence[str], matrix: np.ndarray) -> None:
        """Keep the vectors ``matrix[i]`` of ``keys[i]`` (a key already there is kept)."""
        import numpy as np

        if not len(keys):
            return
        vectors = np.ascontiguousarray(matrix, dtype=np.float32)
        now = time.time()
        con = self._connect(create=True)
        assert con is not None
        try:
            con.execute("BEGIN IMMEDIATE")
            con.executemany("INSERT OR IGNORE INTO embeddings VALUES (?, ?, ?, ?)",
                            [(k, vectors.shape[1], vectors[i].tobytes(), now)
                             for i, k in enumerate(keys)])
            con.execute("COMMIT")
        finally:
            con.close()

    def count_older(self, cutoff: float) -> int:
        """How many entries were stored before ``cutoff`` (a ``time.time()``)."""
        con = self._connect(create=False)
        if con is None:
            return 0
        try:
            return int(con.execute("SELECT count(*) FROM embeddings WHERE created_at < ?",
                                   [cutoff]).fetchall()[0][0])
        except sqlite3.OperationalError:
            return 0
        finally:
            con.close()

    def forget_unused(self, referenced: Iterable[str], cutoff: float) -> int:
        """Delete entries stored before ``cutoff`` whose key is not in ``referenced``."""
        con = self._connect(create=False)
        if con is None:
            return 0
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("CREATE TEMP TABLE IF NOT EXISTS keep (embed_key TEXT PRIMARY KEY)")
            con.execute("DELETE FROM keep")
            con.executemany("INSERT OR IGNORE INTO keep VALUES (?)", [(k,) for k in referenced])
            n = con.execute("""DELETE FROM embeddings WHERE created_at < ? AND NOT EXISTS (
                SELECT 1 FROM keep WHERE keep.embed_key = embeddings.embed_key)""",
                            [cutoff]).rowcount
            con.execute("COMMIT")
            return int(n)
        finally:
            con.close()


@contextmanager
def embedding_cache(index: str | os.PathLike[str], *,
                    timeout: float | None = None) -> Iterator[EmbeddingCache]:
    """Hold the index's embedding lock (``INDEX.embed.lock``) and give its cache.

    Inside the block, look up what is cached, embed the rest and store it:
    another thread or process that wants the same chunks waits, then finds
    them. The lock is not the index's file lock: writers and readers of the
    index go on meanwhile.

    Example:
        >>> with embedding_cache("index.duckdb") as cache:  # doctest: +SKIP
        ...     found = cache.lookup(keys, 384)
        ...     cache.store(missing_keys, vectors)
    """
    path = str(Path(index).resolve())
    deadline = time.monotonic() + (_lock_timeout() if timeout is None else timeout)
    lock = file_lock(path + ".embed.lock", deadline, what="the index's embedding cache")
    try:
        yield EmbeddingCache(path, timeout)
    finally:
        lock.release()


# --------------------------------------------------------------------------- reading


def table_digest(table: pa.Table) -> str:
    """A digest of what writing ``table`` leaves in ``chunks`` (see :func:`document_digests`).

    Covers, per row in position order: position, chunk hash, document hash,
    offsets, source and embedder version.
    """
    cols = [table.column(c).to_pylist() for c in _DIGEST_COLUMNS]
    return _digest(sorted(zip(*cols, strict=True), key=lambda row: row[0]))


_DIGEST_COLUMNS = ("position", "content_hash", "doc_hash", "start_char", "end_char", "source",
                   "embedder_version")


def _digest(rows: Iterable[tuple[Any, ...]]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(repr(row).encode())
    return h.hexdigest()


def document_digests(index: str | os.PathLike[str], *,
                     timeout: float | None = None) -> dict[str, str]:
    """``doc_id -> digest`` of every document's rows in ``chunks``, read in one query.

    A document whose write is still in the index has the digest
    :func:`table_digest` gives for the table that wrote it; a document with
    no rows is absent. A missing index or a file without the tables gives ``{}``.
    """
    if not Path(index).exists():
        return {}

    def read(con: duckdb.DuckDBPyConnection) -> pa.Table | None:
        if not read_meta(con):
            return None
        return con.sql(f"""
            SELECT doc_id, {", ".join(_DIGEST_COLUMNS)} FROM chunks
            ORDER BY doc_id, position""").to_arrow_table()

    table = transaction(index, read, create=False, timeout=timeout)
    if table is None:
        return {}
    out: dict[str, str] = {}
    ids = table.column("doc_id").to_pylist()
    cols = [table.column(c).to_pylist() for c in _DIGEST_COLUMNS]
    rows = list(zip(*cols, strict=True))
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[start]:
            out[ids[start]] = _digest(rows[start:i])
            start = i
    return out


def index_info(index: str | os.PathLike[str]) -> dict[str, Any]:
    """Return the index's meta data and counts (documents, chunks, terms).

    Raises:
        IndexNotFoundError: no such file.
        IndexMismatchError: the file is not a doc_index index.
    """
    def read(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
        meta = read_meta(con)
        if not meta:
            raise IndexMismatchError(f"{str(index)!r} is not a doc_index index (no meta table)")
        docs, chunks = con.execute(
            "SELECT count(DISTINCT doc_id), count(*) FROM chunks").fetchall()[0]
        return {**meta, "dim": int(meta["dim"]), "documents": int(docs), "chunks": int(chunks)}

    with connect(index, create=False) as con:
        return read(con)


def explain(index: str | os.PathLike[str], doc_id: str, position: int) -> dict[str, Any]:
    """Item-level lineage of one chunk: where it came from and who wrote it.

    Returns ``doc_id``, ``position``, ``source`` (the file), ``doc_hash``
    (SHA-256 of the file), ``content_hash`` (SHA-256 of the chunk text),
    ``start_char``/``end_char`` (offsets in the cleaned text), ``text``,
    ``embedder`` and ``embedder_version``, and the ``run_id``, ``task_key``
    and ``attempt`` of the write (with ``written_at``, UTC ISO 8601). Look the
    run up with ``pipeline lineage RUN_ID --task TASK_KEY``.

    Raises:
        ChunkNotFoundError: no such chunk (the message says how many the document has).
    """
    with connect(index, create=False) as con:
        if not read_meta(con):
            raise IndexMismatchError(f"{str(index)!r} is not a doc_index index (no meta table)")
        cur = con.execute("""
            SELECT doc_id, position, source, doc_hash, content_hash, start_char, end_char,
                   text, embedder, embedder_version, run_id, task_key, attempt,
                   strftime(written_at, '%Y-%m-%dT%H:%M:%S.%fZ') AS written_at
            FROM chunks WHERE doc_id = ? AND position = ?""", [doc_id, int(position)])
        names = [d[0] for d in cur.description]
        rows = cur.fetchall()
        if not rows:
            n = con.execute("SELECT count(*) FROM chunks WHERE doc_id = ?",
                            [doc_id]).fetchall()[0][0]
            hint = (f"it has {n} chunks (positions 0-{n - 1})" if n
                    else "that document is not in the index")
            raise ChunkNotFoundError(f"no chunk ({doc_id!r}, {position}) in {str(index)!r}; "
                                     f"{hint}")
        return dict(zip(names, rows[0], strict=True))
