"""The doc index file: its tables, and safe access to it from many threads and processes.

A façade: every name lives in one module of :mod:`ledgerflow_docindex.index`
(errors, locks, the shared handle and its retries, schema, writes, prune, the
embedding cache, explain) and is re-exported here, so that recipes, notebooks
and scripts keep importing ``from ledgerflow_docindex.store import ...``.

Concurrency in short: every operation runs one short transaction on a
connection that is open only while the process has work for the index
(threads of one process share it, see :mod:`.index.handle`), queues behind
other processes with a file lock on ``INDEX.lock``, and retries conflicting
transactions with jittered exponential backoff
(``LEDGERFLOW_INDEX_LOCK_TIMEOUT`` seconds in all, default 60). Beside the
index, ``INDEX.embeddings.sqlite`` is its embedding cache (:mod:`.index.embedcache`).
"""

from __future__ import annotations

from types import ModuleType

from .index import embedcache as _embedcache
from .index import errors as _errors
from .index import explain as _explain
from .index import handle as _handle
from .index import locks as _locks
from .index import prune as _prune
from .index import schema as _schema
from .index import write as _write
from .index.embedcache import PENDING_EMBEDDINGS_HOURS, EmbeddingCache, embedding_cache
from .index.errors import (
    ChunkNotFoundError,
    DocIndexError,
    IndexLockedError,
    IndexMismatchError,
    IndexNotFoundError,
)
from .index.explain import document_digests, explain, index_info, table_digest
from .index.handle import HOLD_SECONDS, connect, transaction
from .index.locks import file_lock
from .index.prune import prune_index
from .index.schema import SCHEMA_VERSION, embed_key, open_index, read_meta, vectors_schema
from .index.write import (
    BulkWriter,
    Provenance,
    WriteResult,
    bulk_writer,
    delete_documents,
    payload_hash,
    write_document,
)
from .terms import keyword_terms

__all__ = [
    "HOLD_SECONDS", "PENDING_EMBEDDINGS_HOURS", "SCHEMA_VERSION", "BulkWriter",
    "ChunkNotFoundError", "DocIndexError", "EmbeddingCache",
    "IndexLockedError", "IndexMismatchError", "IndexNotFoundError", "Provenance",
    "WriteResult", "bulk_writer", "connect", "delete_documents", "document_digests",
    "embed_key", "embedding_cache", "explain", "file_lock", "index_info", "keyword_terms",
    "open_index", "payload_hash", "prune_index", "read_meta", "table_digest", "transaction",
    "vectors_schema", "write_document",
]

#: The modules whose source is the index's code: a recipe task that writes the
#: index versions itself by them (``recipe_task(uses=...)``), not by this façade.
MODULES: tuple[ModuleType, ...] = (_errors, _locks, _handle, _schema, _write, _prune,
                                   _embedcache, _explain)
