"""The index's chunk-level embedding cache: vectors by ``embed_key``, in SQLite.

Beside the index, ``INDEX.embeddings.sqlite`` keeps every vector the pipeline
embedded (:class:`EmbeddingCache`): SQLite, because every embedding step of
every worker process reads and writes it, and SQLite opens in well under a
millisecond and lets many processes in at once, where a DuckDB file costs
about 20 ms to open and admits one process at a time. Nothing of DuckDB here.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from .locks import file_lock, lock_timeout

if TYPE_CHECKING:
    import numpy as np

__all__ = ["PENDING_EMBEDDINGS_HOURS", "EmbeddingCache", "embedding_cache"]

#: How long the embedding cache keeps vectors that no chunk of the index holds (a
#: revert within that time embeds nothing; a run still embedding keeps its work).
PENDING_EMBEDDINGS_HOURS = 24


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
        self._timeout = lock_timeout() if timeout is None else timeout

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
    deadline = time.monotonic() + (lock_timeout() if timeout is None else timeout)
    lock = file_lock(path + ".embed.lock", deadline, what="the index's embedding cache")
    try:
        yield EmbeddingCache(path, timeout)
    finally:
        lock.release()

