"""Where the PostgreSQL store's large results go: a directory every driver can reach.

The files are the shared :class:`ledgerflow.blobs.Blobs` (content-addressed,
paths relative to the root, so machines that mount the same shared directory at
different places still find them), each fsync'd before the commit that names it.
The root is ``LEDGERFLOW_BLOB_DIR`` (default: ``.ledgerflow`` under the working
directory, which only works on one machine: set it to a shared mount, e.g. NFS,
when drivers or workers run on several).
"""

from __future__ import annotations

import os
from pathlib import Path

from ledgerflow.blobs import Blobs

#: JSON results up to this many bytes are kept inline in the ledger rows.
INLINE_LIMIT = 8192


def default_root() -> Path:
    """``LEDGERFLOW_BLOB_DIR``, else ``.ledgerflow`` under the working directory."""
    given = os.environ.get("LEDGERFLOW_BLOB_DIR")
    return Path(given).expanduser().resolve() if given else Path.cwd() / ".ledgerflow"


def shared_blobs(root: Path | None = None) -> Blobs:
    """The result files under ``root`` (default :func:`default_root`)."""
    return Blobs(root if root is not None else default_root(), inline_limit=INLINE_LIMIT,
                 durable=True, missing_hint="set LEDGERFLOW_BLOB_DIR to the shared directory "
                 "the run wrote its results to")
