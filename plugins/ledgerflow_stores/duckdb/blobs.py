"""Result files: large or non-JSON results, content-addressed under ``<ledger>.d/results``.

Small JSON results stay inline in the ledger; tables are written as Parquet
(``read_parquet`` reads them), other values as their pickle or JSON bytes.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
from pathlib import Path
from typing import Any

from ledgerflow.errors import MissingResultError
from ledgerflow.results import Encoded, decode

#: JSON results up to this many bytes are kept inline in the ledger.
INLINE_LIMIT = 2048
_EXT = {"arrow": "parquet", "pickle": "pkl", "json": "json"}


class Blobs:
    """The result files of one ledger."""

    def __init__(self, side: Path) -> None:
        self.side = side

    def put(self, enc: Encoded) -> str | None:
        """Store ``enc`` unless it stays inline; return its URI (relative to the side folder)."""
        if enc.kind == "json" and enc.size <= INLINE_LIMIT:
            return None
        rel = f"results/{enc.hash[:2]}/{enc.hash}.{_EXT[enc.kind]}"
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

    def path(self, uri: str) -> Path:
        """The file behind a result URI."""
        return self.side / uri

    def read(self, kind: str, data: str | None, uri: str | None) -> Any:
        if uri is None:
            return decode(kind, (data or "null").encode())
        path = self.path(uri)
        if not path.exists():
            raise MissingResultError(f"result file {path} is missing",
                                     hint="pipeline resume RUN_ID runs the task that made it "
                                     "again; pipeline doctor lists missing files")
        if kind == "arrow":
            import pyarrow.parquet as pq
            return pq.read_table(path)
        raw = path.read_bytes()
        return pickle.loads(raw) if kind == "pickle" else json.loads(raw)
