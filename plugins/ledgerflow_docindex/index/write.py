"""Writing documents into the index: one document's chunks and postings per transaction.

:func:`write_document` replaces one document's rows (unchanged chunks keep
their row), idempotently and recorded under the task's idempotency key;
:func:`delete_documents` removes documents; :func:`bulk_writer` keeps the file
open for a series of writes from one thread.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ..terms import keyword_terms
from .errors import IndexMismatchError
from .handle import connect, retry, transaction
from .schema import check_or_set_meta, read_meta, vectors_schema

__all__ = ["BulkWriter", "Provenance", "WriteResult", "bulk_writer", "delete_documents",
           "payload_hash", "write_document"]


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
    whose text (and embedder input) did not change keep their row (and the
    provenance of the write that created it), changed or new positions are written, positions the document no longer has
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
        meta = check_or_set_meta(con, embedder, version, dim, index)
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

        return retry(attempt, None, f"write {self.index}")


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
