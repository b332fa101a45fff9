"""Reading the index for checks and people: document digests, ``index_info``, ``explain``."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from .errors import ChunkNotFoundError, IndexMismatchError
from .handle import connect, transaction
from .schema import read_meta

__all__ = ["document_digests", "explain", "index_info", "table_digest"]


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
