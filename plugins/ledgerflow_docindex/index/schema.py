"""The index's tables, its ``meta`` row set and schema upgrades, and ``open_index``.

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
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Any

import duckdb
import pyarrow as pa

from .errors import IndexMismatchError
from .handle import transaction

__all__ = ["SCHEMA_VERSION", "check_or_set_meta", "embed_key", "open_index", "read_meta",
           "vectors_schema"]

#: 2 added ``chunks.embed_key`` (a version 1 index is upgraded in place when a run
#: opens it).
SCHEMA_VERSION = 2


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


def check_or_set_meta(con: duckdb.DuckDBPyConnection, embedder: str, version: str,
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
        check_or_set_meta(con, embedder, version, dim, str(index))
        found = con.execute("SELECT value FROM meta WHERE key = 'index_id'").fetchall()
        if found:
            index_id = found[0][0]
        else:
            index_id = uuid.uuid4().hex
            con.execute("INSERT INTO meta VALUES ('index_id', ?)", [index_id])
        return {"index": str(index), "index_id": index_id, "embedder": embedder,
                "embedder_version": version, "dim": dim}

    return transaction(index, apply, timeout=timeout)
