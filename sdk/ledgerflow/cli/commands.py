"""Where the ``pipeline`` commands used to live: the names plugins import from here.

The commands are now one module per family (:mod:`.drive`, :mod:`.inspect`,
:mod:`.approvals`, :mod:`.ledger`) on the group of :mod:`.options`.
"""

from __future__ import annotations

from .options import DASK, EXECUTOR, JSON, LOGS, STORE, WAIT, WORKERS, PipelineGroup, main

__all__ = ["DASK", "EXECUTOR", "JSON", "LOGS", "STORE", "WAIT", "WORKERS", "PipelineGroup",
           "main"]
