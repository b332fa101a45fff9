"""Pruning the index: the chunks of deleted or changed documents, and unused cached vectors."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from .embedcache import PENDING_EMBEDDINGS_HOURS, EmbeddingCache
from .handle import transaction
from .schema import read_meta

__all__ = ["prune_index"]


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

