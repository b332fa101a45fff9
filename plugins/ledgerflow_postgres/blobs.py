"""Large results: content-addressed files in a directory every driver can reach.

Small JSON results (up to :data:`INLINE_LIMIT` bytes) stay inline in the
ledger rows. Others are written once (and fsync'd before the commit that
names them) under ``ROOT/results/<2 hex>/<hash>.<ext>`` (tables as Parquet,
other values as their pickle or JSON bytes), and the ledger keeps the path
relative to ``ROOT``, so machines that mount the same shared directory at
different places still find them. ``ROOT`` is ``LEDGERFLOW_BLOB_DIR``
(default: ``.ledgerflow`` under the working directory, which only works on
one machine: set it to a shared mount, e.g. NFS, when drivers or workers
run on several).
"""

from __future__ import annotations

import json
import os
import pickle
import threading
from pathlib import Path
from typing import Any

from ledgerflow.errors import StoreError
from ledgerflow.results import Encoded, decode

#: JSON results up to this many bytes are kept inline in the ledger.
INLINE_LIMIT = 8192
_EXT = {"arrow": "parquet", "pickle": "pkl", "json": "json"}


def default_root() -> Path:
    """``LEDGERFLOW_BLOB_DIR``, else ``.ledgerflow`` under the working directory."""
    given = os.environ.get("LEDGERFLOW_BLOB_DIR")
    return Path(given).expanduser().resolve() if given else Path.cwd() / ".ledgerflow"


class Blobs:
    """The result files of one store (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, enc: Encoded) -> str | None:
        """Store ``enc`` unless it stays inline; return its URI (relative to the root)."""
        if enc.kind == "json" and enc.size <= INLINE_LIMIT:
            return None
        rel = f"results/{enc.hash[:2]}/{enc.hash}.{_EXT[enc.kind]}"
        path = self.root / rel
        if not path.exists():        # content-addressed: the same bytes are written once
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            if enc.kind == "arrow":
                import pyarrow.parquet as pq
                pq.write_table(decode("arrow", enc.data), tmp)
            else:
                tmp.write_bytes(enc.data)
            with open(tmp, "rb") as fh:    # durable before the commit that names it
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        return rel

    def path(self, uri: str) -> Path:
        """The file behind a result URI."""
        return self.root / uri

    def read(self, kind: str, data: str | None, uri: str | None) -> Any:
        if uri is None:
            return decode(kind, (data or "null").encode())
        path = self.path(uri)
        try:
            if kind == "arrow":
                import pyarrow.parquet as pq
                return pq.read_table(path)
            raw = path.read_bytes()
        except FileNotFoundError:
            raise StoreError(f"result file {path} is missing",
                             hint="set LEDGERFLOW_BLOB_DIR to the shared directory the run "
                             "wrote its results to") from None
        return pickle.loads(raw) if kind == "pickle" else json.loads(raw)
