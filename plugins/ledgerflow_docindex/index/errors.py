"""The index's errors: each a cause and a ``hint``, like every ledgerflow error.

::

    DocIndexError (ledgerflow.errors.PipelineError)
    ├─ IndexNotFoundError   (also a FileNotFoundError)
    ├─ IndexLockedError     (also a TimeoutError)
    ├─ IndexMismatchError   (also a ValueError)
    └─ ChunkNotFoundError   (also a LookupError)
"""

from __future__ import annotations

from ledgerflow.errors import PipelineError

__all__ = ["ChunkNotFoundError", "DocIndexError", "IndexLockedError", "IndexMismatchError",
           "IndexNotFoundError"]


class DocIndexError(PipelineError):
    """Base of the index errors (a cause and a ``hint``, like every ledgerflow error)."""

    default_hint = "check the index path, or build the index with the doc_index pipeline"


class IndexNotFoundError(DocIndexError, FileNotFoundError):
    """The index file does not exist."""

    default_hint = ("build it first: pipeline run recipes/doc_index/pipeline.py "
                    "-p source=DOCS -p index=INDEX")


class IndexLockedError(DocIndexError, TimeoutError):
    """The index stayed locked by another process (or conflicting) for too long."""

    default_hint = ("wait for the process using the index, or raise "
                    "LEDGERFLOW_INDEX_LOCK_TIMEOUT (seconds)")


class IndexMismatchError(DocIndexError, ValueError):
    """The index was built with another embedder (or vector size) than the one given."""

    default_hint = "use the embedder the index was built with, or a new index path"


class ChunkNotFoundError(DocIndexError, LookupError):
    """No chunk with that ``(doc_id, position)`` is in the index."""

    default_hint = "pass a position the document has (see the search hits)"
