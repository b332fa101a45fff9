"""Result files: large or non-JSON results, content-addressed under a store's root folder.

Small JSON results (up to the store's inline limit) stay inline in the ledger
rows. Others are written once under ``ROOT/results/<2 hex>/<hash>.<ext>``
(tables as Parquet, which ``read_parquet`` reads; other values as their pickle
or JSON bytes), and the ledger keeps the path relative to ``ROOT``. The DuckDB
store's root is the ledger's side folder; the PostgreSQL store's is a
directory every driver reaches, and it asks for each file to be fsync'd before
the commit that names it.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
from pathlib import Path
from typing import Any

from . import private
from .errors import MissingResultError
from .results import Encoded, decode

_EXT = {"arrow": "parquet", "pickle": "pkl", "json": "json"}


class Blobs:
    """The result files of one store.

    Args:
        root: the folder result URIs are relative to.
        inline_limit: JSON results up to this many bytes stay in the ledger.
        durable: fsync each file before it is named (a store whose commits
            are durable against a machine crash).
        missing_hint: how to fix a result file that is gone.
    """

    def __init__(self, root: Path, *, inline_limit: int, durable: bool = False,
                 missing_hint: str) -> None:
        self.root = root
        self.inline_limit = inline_limit
        self.durable = durable
        self.missing_hint = missing_hint

    def put(self, enc: Encoded) -> str | None:
        """Store ``enc`` unless it stays inline; return its URI (relative to the root)."""
        if enc.kind == "json" and enc.size <= self.inline_limit:
            return None
        rel = f"results/{enc.hash[:2]}/{enc.hash}.{_EXT[enc.kind]}"
        path = self.root / rel
        if not path.exists():        # content-addressed: the same bytes are written once
            private.make_dirs(path.parent)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            if enc.kind == "arrow":
                import pyarrow.parquet as pq
                pq.write_table(decode("arrow", enc.data), tmp)
                private.restrict(tmp)
            else:
                private.write_file(tmp, enc.data)
            if self.durable:
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
        return rel

    def path(self, uri: str) -> Path:
        """The file behind a result URI."""
        return self.root / uri

    def exists(self, uri: str) -> bool:
        """True if the file behind ``uri`` is still there."""
        return self.path(uri).exists()

    def read(self, kind: str, data: str | None, uri: str | None) -> Any:
        """The value of a result: inline ``data``, or the file at ``uri``.

        Raises:
            MissingResultError: the file is gone.
        """
        if uri is None:
            return decode(kind, (data or "null").encode())
        path = self.path(uri)
        if not path.exists():
            raise MissingResultError(f"result file {path} is missing", hint=self.missing_hint)
        if kind == "arrow":
            import pyarrow.parquet as pq
            return pq.read_table(path)
        raw = path.read_bytes()
        return pickle.loads(raw) if kind == "pickle" else json.loads(raw)


class MemoryBlobs:
    """Result bytes kept in this process's memory (the memory store's), by content hash.

    JSON results up to ``inline_limit`` bytes stay inline in the records.
    """

    def __init__(self, *, inline_limit: int = 65536) -> None:
        self.inline_limit = inline_limit
        self._data: dict[str, bytes] = {}

    def put(self, enc: Encoded) -> str | None:
        """Keep ``enc`` unless it stays inline; return its ``memory://`` URI."""
        if enc.kind == "json" and enc.size <= self.inline_limit:
            return None
        uri = f"memory://{enc.hash}.{enc.kind}"
        self._data[uri] = enc.data
        return uri

    def read(self, kind: str, data: str | None, uri: str | None) -> Any:
        """The value of a result: inline ``data``, or the bytes kept under ``uri``."""
        if uri is None:
            return decode(kind, (data or "null").encode())
        if uri not in self._data:
            raise MissingResultError(f"result {uri} is not in this process",
                                     hint="the memory store keeps nothing across processes")
        return decode(kind, self._data[uri])

    def exists(self, uri: str) -> bool:
        """True if ``uri`` is kept here."""
        return uri in self._data

    def path(self, uri: str) -> Path:
        """Memory results have no file."""
        raise MissingResultError(f"result {uri} is kept in memory, not in a file",
                                 hint="use a DuckDB or PostgreSQL store for result files")
