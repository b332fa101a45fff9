"""doc_index: turn a folder of documents into a searchable, incrementally updated index.

Run it (defaults: the bundled corpus, ``index.duckdb`` in the working directory,
the fast ``hashing`` embedder)::

    pipeline run recipes/doc_index/pipeline.py
    pipeline run recipes/doc_index/pipeline.py -p source=docs/ -p index=docs.duckdb \\
        -p embedder=minilm
    python recipes/doc_index/doc_index_search.py index.duckdb "patent grant"

Graph: ``open_index`` creates the index (or checks its embedder) and
``discover`` lists the documents with their content hashes; then, one chain per
document (keyed by its relative path), ``read -> clean -> chunk -> embed ->
update_index``; finally ``prune`` drops the chunks of deleted or changed
documents. Because ``discover`` returns each document's content hash, an
unchanged document's chain has the same fingerprints as in the previous run and
is reused from the ledger: a rerun embeds nothing, and an edit re-runs only the
edited document's chain. ``open_index``, ``discover`` and ``prune`` look at
external state (the index, the folder), so they are never cached; the index's
id (from ``open_index``) is an input of ``update_index``, so a deleted or
replaced index is rewritten in full, from the cached embeddings.

``update_index`` is an effect on the index, so its cached result is reused only
while the index still holds exactly what that write left (``@task(verify=...)``,
checked against one snapshot of the index's documents per run): a document whose
content comes back (a restored file, a reverted edit, a file renamed back) is
written again. ``embed`` looks each chunk up in the index's embedding cache
first (keyed by the embedder's input and identity), so an edit embeds only the
chunks whose text changed, and two runs on one index embed each chunk once.

Relative ``source`` and ``index`` paths are relative to the working directory
of the run (resume a run from the same directory).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import doc_index_text as text
import numpy as np
import pyarrow as pa

from ledgerflow import InputError, Limits, NonRetryableError, context, pipeline, program, task
from ledgerflow.programs import ProgramError
from ledgerflow_docindex import store
from ledgerflow_docindex import terms as index_terms
from ledgerflow_embed import Embedder, encode, get_embedder

log = logging.getLogger("ledgerflow.doc_index")

F = TypeVar("F", bound=Callable[..., Any])

#: The code of the index (the façade and every module of ``ledgerflow_docindex.index``):
#: a task that reads or writes the index is versioned by all of it.
STORE = (store, *store.MODULES)

#: The bundled corpus (the default ``source``).
CORPUS = str(Path(__file__).resolve().parent / "corpus")
LEDGERFLOW_WATCH = ("source",)  #: what ``pipeline watch`` watches: the ``source`` path


def _source_hash(module: ModuleType) -> str:
    return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()


def recipe_task(*, uses: tuple[ModuleType, ...] = (), **options: Any) -> Callable[[F], Any]:
    """``@task`` whose code version also covers the helper modules it calls.

    ledgerflow hashes only a task's own source; the text and store helpers
    live in sibling modules, so their source is part of the version: editing
    ``doc_index_text.py`` invalidates the cached read/clean/chunk results.
    """
    def wrap(fn: F) -> Any:
        h = hashlib.sha256(inspect.getsource(fn).encode())
        for module in uses:
            h.update(_source_hash(module).encode())
        return task(version=h.hexdigest()[:16], **options)(fn)

    return wrap


@recipe_task(uses=STORE, cache=False, retries=2, retry_delay=1.0)
def open_index(index: str, embedder: str, embedder_version: str, dim: int) -> dict[str, Any]:
    """Create the index if needed and check that it holds this embedder's vectors.

    Never cached. Its result (with the index file's random ``index_id``) is
    an input of every ``update_index``: if the index file was deleted or
    replaced, all documents are written again, from the cached embeddings.
    """
    try:
        return store.open_index(index, embedder, embedder_version, int(dim))
    except store.IndexMismatchError as exc:
        raise NonRetryableError(str(exc)) from exc


@recipe_task(uses=(text,), cache=False)
def discover(source: str, exclude: list[str] | None = None) -> list[dict[str, str]]:
    """List ``.txt .md .html .pdf`` files under ``source`` with their content hashes.

    Returns ``[{doc_id, path, content_hash, format}]`` sorted by ``doc_id`` (the
    path relative to ``source``). Never cached: it reads the folder. A symlink
    to a file outside ``source`` is not indexed: a warning in the task's log
    names it.
    """
    skipped: list[tuple[str, str]] = []
    try:
        docs = text.discover_documents(source, exclude or (), skipped=skipped)
    except FileNotFoundError as exc:
        raise NonRetryableError(f"{exc}; pass -p source=FOLDER") from exc
    for doc_id, target in skipped:
        log.warning("skipped %s: a symlink to %s, outside the source folder (not indexed)",
                    doc_id, target)
    return docs


#: ``-p pdf_reader=pdftotext``: poppler's ``pdftotext`` as a program step (Debian
#: package ``poppler-utils``), in its own process tree with a timeout and rlimits,
#: instead of pypdf in the task's process.
pdftotext = program("pdftotext", ["pdftotext", "-enc", "UTF-8", "-q", "{src}", "{dst}"],
                    timeout=120, grace=2, limits=Limits(cpu_s=120, memory_mb=2048))

#: The PDF readers ``-p pdf_reader=...`` accepts.
PDF_READERS = ("pypdf", "pdftotext")


def _pdftotext_text(path: Path) -> str:
    """The text of a PDF by ``pdftotext``; a PDF it cannot read is not retried."""
    with tempfile.TemporaryDirectory(prefix="ledgerflow-pdftotext-") as tmp:
        out = Path(tmp) / "text.txt"
        try:
            pdftotext(src=str(path), dst=str(out))
        except ProgramError as exc:
            if exc.exit_code is None:       # killed (a limit): not the document's fault
                raise
            raise NonRetryableError(f"{path.name}: {exc}") from exc
        return out.read_text(encoding="utf-8", errors="replace")


@recipe_task(uses=(text,), retries=2, retry_delay=0.2)
def read(doc: dict[str, str], pdf_reader: str = "pypdf") -> dict[str, str]:
    """Read one document's text (PDF text extracted; HTML/Markdown markup kept for clean).

    ``pdf_reader="pdftotext"`` extracts PDFs with the :data:`pdftotext` program.
    """
    path = Path(doc["path"])
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NonRetryableError(
            f"{doc['doc_id']} was deleted during the run; run the pipeline again") from None
    digest = text.sha256_bytes(data)
    if digest != doc["content_hash"]:
        raise NonRetryableError(
            f"{doc['doc_id']} changed after discover listed it; run the pipeline again")
    try:
        if doc["format"] == "pdf" and pdf_reader == "pdftotext":
            raw = _pdftotext_text(path)
        else:
            raw = text.extract_text(data, doc["format"])
    except text.DocumentError as exc:
        raise NonRetryableError(f"{doc['doc_id']}: {exc}") from exc
    context().record_input(path.resolve().as_uri(), content_hash=digest,
                           doc_id=doc["doc_id"], format=doc["format"], bytes=str(len(data)))
    return {**doc, "text": raw}


@recipe_task(uses=(text,))
def clean(doc: dict[str, str]) -> dict[str, str]:
    """Strip markup, NFKC-normalise and normalise whitespace."""
    return {**doc, "text": text.clean_text(doc["text"], doc["format"])}


@recipe_task(uses=(text,))
def chunk(doc: dict[str, str], size: int = 800, overlap: int = 100) -> dict[str, Any]:
    """Cut the cleaned text into overlapping chunks (whole words), each with a content hash."""
    try:
        chunks = text.chunk_text(doc["text"], int(size), int(overlap))
    except ValueError as exc:
        raise NonRetryableError(str(exc)) from exc
    return {"doc_id": doc["doc_id"], "path": doc["path"], "doc_hash": doc["content_hash"],
            "chunks": [c.as_dict() for c in chunks]}


@recipe_task(uses=(text, *STORE), retries=2, retry_delay=1.0)
def embed(doc: dict[str, Any], embedder: str = "hashing", embedder_version: str | None = None,
          batch_size: int = 64, index: str | None = None, titles: bool = True) -> pa.Table:
    """Embed a document's chunks in batches; return them as an Arrow table.

    Each chunk is embedded as ``"<document title>: <chunk text>"`` (the title
    comes from the document id; ``titles=False``: the text alone), so a chunk
    keeps its document's context. With ``index``, each chunk is first looked
    up in the index's embedding cache by :func:`store.embed_key` (the exact
    input and the embedder's name and version): only chunks not embedded
    before are given to the model, and they are stored for the next run (or
    a concurrent one, which waits for this lookup-embed-store step and then
    finds them). The embedder is built once per worker process.
    ``embedder_version``, fixed when the run starts, makes the version part of
    the fingerprint: a new model version re-embeds.
    """
    emb = get_embedder(embedder)
    if embedder_version is not None and emb.version != embedder_version:
        raise NonRetryableError(
            f"embedder {embedder!r} is version {emb.version} in this worker, but the run "
            f"was started with {embedder_version}; start a new run")
    chunks = doc["chunks"]
    texts = [c["text"] for c in chunks]
    title = text.document_title(doc["doc_id"])
    inputs = [f"{title}: {t}" for t in texts] if titles else list(texts)
    keys = [store.embed_key(emb.name, emb.version, s) for s in inputs]
    matrix = _embed_cached(emb, inputs, keys, index, max(1, int(batch_size)), doc["doc_id"])
    flat = pa.array(matrix.astype(np.float32, copy=False).reshape(-1))
    schema = store.vectors_schema(emb.dim).with_metadata(
        {"doc_id": doc["doc_id"], "doc_hash": doc["doc_hash"]})
    n = len(chunks)
    return pa.table({
        "doc_id": [doc["doc_id"]] * n, "doc_hash": [doc["doc_hash"]] * n,
        "source": [doc["path"]] * n,
        "position": [c["position"] for c in chunks],
        "start_char": [c["start"] for c in chunks], "end_char": [c["end"] for c in chunks],
        "text": texts, "content_hash": [c["content_hash"] for c in chunks],
        "embedding": pa.FixedSizeListArray.from_arrays(flat, emb.dim),
        "embedder": [emb.name] * n, "embedder_version": [emb.version] * n,
        "embed_key": keys,
    }, schema=schema)


def _embed_cached(emb: Embedder, inputs: list[str], keys: list[str], index: str | None,
                  step: int, doc_id: str) -> np.ndarray:
    """Vectors of ``inputs`` (rows in order): from the index's cache, else from the model."""
    ctx = context()
    first_input: dict[str, str] = {}
    for key, item in zip(keys, inputs, strict=True):
        first_input.setdefault(key, item)      # the same text twice is embedded once
    cache = store.EmbeddingCache(index) if index is not None and Path(index).exists() else None
    found = cache.lookup(list(first_input), emb.dim) if cache is not None else {}
    missing = [k for k in first_input if k not in found]
    if missing:
        # look again under the index's embedding lock: a concurrent run may be
        # embedding the same chunks right now; what it stored is not embedded twice
        guard = store.embedding_cache(index) if cache is not None and index else nullcontext()
        with guard:
            if cache is not None:
                found.update(cache.lookup(missing, emb.dim))
                missing = [k for k in missing if k not in found]
            for start in range(0, len(missing), step):
                ctx.raise_if_cancelled()  # a cancel request ends the attempt between batches
                part = missing[start:start + step]
                vectors = encode(emb, [first_input[k] for k in part], batch_size=step)
                if cache is not None:
                    cache.store(part, vectors)   # kept even if a later batch fails
                found.update(zip(part, vectors, strict=True))
    reused = len(keys) - len(missing)
    log.info("%s: embedded %d of %d chunks (%d from the cache)", doc_id, len(missing),
             len(keys), reused)
    if cache is not None and index is not None:
        ctx.record_input(f"{Path(index).resolve().as_uri()}#embeddings", doc_id=doc_id,
                         reused=str(reused), embedded=str(len(missing)))
    if not keys:
        return np.zeros((0, emb.dim), np.float32)
    return np.stack([np.asarray(found[k], dtype=np.float32) for k in keys])


#: Per run, one snapshot of the index's documents: ``id(open_index result)`` -> (it, snapshot).
_snapshots: dict[int, tuple[object, dict[str, str]]] = {}
_snapshots_lock = threading.Lock()


def index_holds_write(result: dict[str, Any], vectors: pa.Table, index: str = "index.duckdb",
                      opened: dict[str, Any] | None = None) -> bool:
    """``verify=`` of ``update_index``: does the index still hold what this write left?

    True when the document's rows in ``chunks`` are exactly the rows ``vectors``
    writes (positions, chunk hashes, document hash, offsets, embedder version),
    or, for a document with no chunks, when it has none. The index's documents
    are read once per run, at the first check (the snapshot is keyed by this
    run's ``open_index`` result, the one object every ``update_index`` of the
    run receives): until ``prune`` at the end, the only writer of a document's
    rows in this run is that document's own ``update_index``, the very task
    being checked, so the snapshot still shows its rows when its check comes.
    Another process writing the same index meanwhile is not seen; see the
    README (one run per index, or runs over the same folder).
    """
    doc_id = result.get("doc_id")
    if doc_id is None:    # an empty table without a document id: nothing was written
        return True
    if opened is None:
        snapshot = store.document_digests(index)
    else:
        with _snapshots_lock:
            entry = _snapshots.get(id(opened))
            if entry is None or entry[0] is not opened:
                entry = (opened, store.document_digests(index))
                _snapshots[id(opened)] = entry
                while len(_snapshots) > 4:       # runs of the past: forget them
                    del _snapshots[next(iter(_snapshots))]
            snapshot = entry[1]
    if vectors.num_rows == 0:
        return doc_id not in snapshot
    return snapshot.get(doc_id) == store.table_digest(vectors)


@recipe_task(uses=(*STORE, index_terms), retries=4, retry_delay=0.5, backoff=2.0, jitter=0.2,
             verify=index_holds_write)
def update_index(vectors: pa.Table, index: str = "index.duckdb",
                 opened: dict[str, Any] | None = None) -> dict[str, Any]:
    """Replace one document's chunks in the index (idempotent, one short transaction).

    The task's idempotency key is stored with the write, so a retry after a
    crash that followed the commit is a no-op: no duplicate, no missing row.
    ``opened`` is the result of ``open_index`` (the write checks the index id).
    A cached result is reused only while :func:`index_holds_write` finds the
    write still in the index.
    """
    ctx = context()
    provenance = store.Provenance(run_id=ctx.run_id, task_key=ctx.task_key,
                                  attempt=ctx.attempt, idempotency_key=ctx.idempotency_key)
    try:
        result = store.write_document(index, vectors, provenance=provenance,
                                      index_id=opened["index_id"] if opened else None)
    except store.IndexMismatchError as exc:
        raise NonRetryableError(str(exc)) from exc
    if result.doc_id is not None:
        ctx.record_output(
            f"{Path(index).resolve().as_uri()}#chunks?doc_id={result.doc_id}",
            content_hash=store.payload_hash(vectors) if vectors.num_rows else None,
            doc_id=result.doc_id, doc_hash=result.doc_hash or "", chunks=str(result.chunks),
            inserted=str(result.inserted), deleted=str(result.deleted),
            skipped=str(result.skipped).lower())
    return {**result.as_dict(), "index": str(index)}


@recipe_task(uses=STORE, cache=False, retries=2, retry_delay=1.0)
def prune(index: str, docs: list[dict[str, str]], confirm: bool = False) -> dict[str, Any]:
    """Remove the chunks of documents that were deleted (or changed and wrote fewer chunks).

    With ``confirm``, deleting documents from the index needs a person's
    approval first (``pipeline approvals`` / ``pipeline approve``): the request
    names the documents, and is bound to exactly that list. Refused, nothing
    is deleted and the task fails. Nothing to delete asks nothing.
    """
    if confirm:
        listed = {d["doc_id"] for d in docs}
        gone = sorted(set(store.document_digests(index)) - listed) \
            if Path(index).exists() else []
        if gone:
            decision = context().approval(
                "delete documents from the index",
                {"index": str(Path(index).resolve()), "documents": gone})
            if not decision.approved:
                raise NonRetryableError(
                    f"deleting {len(gone)} document(s) from the index was {decision.decision} "
                    f"by {decision.by or 'someone'}: {decision.reason or 'no reason'}; "
                    "the index keeps them")
    result = store.prune_index(index, docs)
    if result["deleted_chunks"]:
        context().record_output(Path(index).resolve().as_uri() + "#chunks",
                                deleted_chunks=str(result["deleted_chunks"]),
                                deleted_documents=",".join(result["deleted_documents"]))
    return result


def _flag(value: object) -> bool:
    """A boolean parameter given as a bool or as text (``-p titles=false``)."""
    if isinstance(value, str):
        if value.strip().lower() in ("0", "false", "no", "off"):
            return False
        if value.strip().lower() in ("1", "true", "yes", "on"):
            return True
        raise InputError(f"expected true or false, given: {value!r}",
                         hint="e.g. -p titles=false")
    return bool(value)


@pipeline
def doc_index(source: str = CORPUS, index: str = "index.duckdb", embedder: str = "hashing",
              chunk_size: int = 800, overlap: int = 100, batch_size: int = 64,
              exclude: list[str] | None = None, titles: bool = True,
              pdf_reader: str = "pypdf", confirm_prune: bool = False) -> dict[str, Any]:
    """Index the documents under ``source`` into the DuckDB file ``index``.

    Args:
        source: folder (searched recursively) or single file; default: the bundled corpus.
            A missing one is refused while the body is traced (exit 2), so the run
            never starts and no index file is created (a resume checks it again).
        index: the index file (created on first run).
        embedder: an installed embedder name: ``hashing`` (fast, lexical) or ``minilm``.
        chunk_size: maximum characters per chunk (a longer single word is kept whole).
        overlap: at most this many characters repeated between consecutive chunks.
        batch_size: texts per embedding call.
        exclude: glob patterns of files to skip (matched on relative path and name).
        titles: embed each chunk as "<document title>: <text>" (default); false:
            the text alone, so equal chunks of different documents share one vector.
        pdf_reader: ``pypdf`` (default) or ``pdftotext`` (a program step; needs
            poppler-utils).
        confirm_prune: ask a person before deleting documents from the index.
    """
    if not Path(source).expanduser().exists():   # refused before anything is created
        raise InputError(f"source {source!r} does not exist "
                         f"(looked in {Path(source).expanduser().absolute()})",
                         hint="pass a folder or file of documents: -p source=DOCS "
                              "(without -p source: the bundled corpus)")
    try:
        text.check_chunk_params(int(chunk_size), int(overlap))
    except ValueError as exc:
        raise InputError(str(exc), hint="e.g. -p chunk_size=800 -p overlap=100") from None
    if isinstance(exclude, str):
        exclude = [exclude]
    if pdf_reader not in PDF_READERS:
        raise InputError(f"unknown pdf_reader {pdf_reader!r}; one of: {', '.join(PDF_READERS)}",
                         hint="e.g. -p pdf_reader=pdftotext")
    if pdf_reader == "pdftotext" and shutil.which("pdftotext") is None:
        raise InputError("pdf_reader=pdftotext, but pdftotext is not installed",
                         hint="install poppler-utils (apt-get install poppler-utils), "
                              "or use -p pdf_reader=pypdf")
    emb = get_embedder(embedder)  # an unknown name fails here, listing the installed ones
    opened = open_index(index, emb.name, emb.version, emb.dim)
    docs = discover(source, exclude)
    texts = read.map(docs, key="doc_id", pdf_reader=pdf_reader)
    cleaned = clean.map(texts)
    chunks = chunk.map(cleaned, size=int(chunk_size), overlap=int(overlap))
    # after=[opened]: nothing is embedded when the index cannot take these vectors
    vectors = embed.map(chunks, embedder=embedder, embedder_version=emb.version,
                        batch_size=int(batch_size), index=index, titles=_flag(titles),
                        after=[opened])
    written = update_index.map(vectors, index=index, opened=opened)
    return prune(index, docs, confirm=_flag(confirm_prune), after=[written])
