"""Search a doc index: vector, keyword (BM25) or hybrid (reciprocal rank fusion) hit records.

As functions (the ``pipeline search`` command and any console use the same)::

    from ledgerflow_docindex.search import search, search_many, format_hit
    for hit in search("index.duckdb", "patent grant", k=3):
        print(format_hit(hit))
    hits_per_query = search_many("index.duckdb", ["patent grant", "warranty"], k=3)

* ``vector``: cosine similarity between the query's embedding and every chunk's
  (``array_cosine_similarity``, brute force). The query is embedded with the
  embedder the index was built with, read from the index.
* ``keyword``: Okapi BM25 (k1=1.2, b=0.75) over the ``postings`` table, in SQL
  (terms as :func:`ledgerflow_docindex.terms.index_terms` makes them, for chunks
  and queries alike).
* ``hybrid``: reciprocal rank fusion of both rankings,
  ``rrf = sum(1 / (60 + rank))`` over the top candidates of each.

Every hit carries all the scores it has (``cosine`` and ``cosine_rank``,
``bm25`` and ``bm25_rank``, ``rrf``), its source file, position and character
offsets, and a whitespace-collapsed snippet with the query terms' spans
(``marks``). Chunks with the same text (identical or near-identical
documents) collapse into the best-ranked one; the others are listed in
``same``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .index.errors import DocIndexError, IndexMismatchError
from .index.handle import connect
from .index.schema import read_meta
from .terms import index_terms, term_spans

__all__ = ["MODES", "Hit", "Same", "SearchError", "format_hit", "hit_json", "search",
           "search_many", "snippet", "snippet_marks"]

MODES = ("hybrid", "vector", "keyword")
BM25_K1 = 1.2
BM25_B = 0.75
RRF_K = 60
#: Which score orders the hits of each mode.
SCORE_KIND = {"hybrid": "rrf", "vector": "cosine", "keyword": "bm25"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Same:
    """Another chunk with exactly the text of a hit (collapsed into it)."""

    doc_id: str
    source: str | None
    position: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Hit:
    """One ranked chunk, with every score it has and where it comes from.

    ``score`` is the score that ranks the hits of the mode (``score_kind``:
    ``"rrf"`` for hybrid, ``"cosine"``, ``"bm25"``); the others are None when
    the chunk was not among that ranking's candidates. ``marks`` are the
    ``(start, end)`` spans of query terms in ``snippet``; ``same`` lists the
    other chunks of the index with the same text (``content_hash``).
    """

    rank: int
    doc_id: str
    position: int
    score: float
    score_kind: str
    snippet: str
    source: str | None = None
    start_char: int | None = None
    end_char: int | None = None
    chunk_id: str = ""
    content_hash: str = ""
    doc_hash: str = ""
    cosine: float | None = None
    cosine_rank: int | None = None
    bm25: float | None = None
    bm25_rank: int | None = None
    rrf: float | None = None
    marks: tuple[tuple[int, int], ...] = ()
    same: tuple[Same, ...] = field(default=())


class SearchError(DocIndexError, ValueError):
    """The query or its options are invalid."""

    default_hint = "pass a non-empty query, k >= 1 and a mode: hybrid, vector or keyword"


def search(index: str | os.PathLike[str], query: str, k: int = 5, mode: str = "hybrid",
           embedder: str | None = None, *, candidates: int | None = None,
           snippet_chars: int = 200, collapse: bool = True) -> list[Hit]:
    """Return the ``k`` best chunks for ``query``, best first.

    Args:
        index: the DuckDB index file written by the doc_index pipeline.
        query: free text.
        k: how many hits.
        mode: ``"hybrid"`` (default), ``"vector"`` or ``"keyword"``.
        embedder: optional; must equal the index's embedder (checked).
        candidates: how many chunks each ranking contributes (default max(50, 5k)).
        snippet_chars: length of each hit's text snippet.
        collapse: fold chunks with the same text into the best-ranked one.

    Raises:
        SearchError: empty query, bad ``k`` or ``mode``.
        store.IndexNotFoundError: no such index file.
        store.IndexMismatchError: ``embedder`` differs from the index's, or the
            installed version of that embedder differs from the one that built it.

    Example:
        >>> for hit in search("index.duckdb", "patent grant", k=2):  # doctest: +SKIP
        ...     print(hit.rank, hit.doc_id, hit.position, hit.score_kind, hit.score)
    """
    return search_many(index, [query], k, mode, embedder, candidates=candidates,
                       snippet_chars=snippet_chars, collapse=collapse)[0]


def search_many(index: str | os.PathLike[str], queries: Sequence[str], k: int = 5,
                mode: str = "hybrid", embedder: str | None = None, *,
                candidates: int | None = None, snippet_chars: int = 200,
                collapse: bool = True) -> list[list[Hit]]:
    """Answer several queries at once: one index read, one embedding call for all.

    Same arguments as :func:`search`; returns one hit list per query, in order.
    The embedder is built once per process, so a long-lived caller (a console,
    ``pipeline search`` reading stdin) pays the model load once.
    """
    if mode not in MODES:
        raise SearchError(f"unknown mode {mode!r}; use one of: {', '.join(MODES)}")
    if k < 1:
        raise SearchError(f"k must be at least 1, given: {k}")
    for query in queries:
        if not query or not query.strip():
            raise SearchError("the query is empty")
    if not queries:
        return []
    pool = candidates or max(50, 5 * k)
    with connect(index, create=False) as con:
        meta = read_meta(con)
    if not meta:
        raise IndexMismatchError(f"{str(index)!r} is not a doc_index index (no meta table)")
    vectors: list[list[float] | None] = [None] * len(queries)
    if mode != "keyword":
        vectors = _query_vectors(meta, queries, embedder, str(index))
    out = []
    with connect(index, create=False) as con:
        for query, vector in zip(queries, vectors, strict=True):
            bm25 = _bm25(con, query, pool) if mode != "vector" else []
            cosine = _cosine(con, vector, int(meta["dim"]), pool) if vector is not None else []
            out.append(_hits(con, query, mode, k, bm25, cosine, snippet_chars, collapse))
    return out


def _query_vectors(meta: dict[str, str], queries: Sequence[str], embedder: str | None,
                   index: str) -> list[list[float] | None]:
    """Embed the queries with the index's embedder; None for an all-zero vector."""
    from ledgerflow_embed import encode, get_embedder

    built_with = meta["embedder"]
    if embedder is not None and embedder != built_with:
        raise IndexMismatchError(
            f"index {index!r} was built with embedder {built_with!r}, not {embedder!r}",
            hint=f"search it with embedder={built_with!r} (or omit embedder)")
    emb = get_embedder(built_with)
    if emb.version != meta["embedder_version"]:
        raise IndexMismatchError(
            f"index {index!r} was built with {built_with} version {meta['embedder_version']}, "
            f"but version {emb.version} is installed",
            hint="rebuild the index (new index path) or install the version it was built with")
    out: list[list[float] | None] = []
    for vec in encode(emb, list(queries)):
        norm = float((vec * vec).sum())
        out.append(None if not math.isfinite(norm) or norm == 0.0 else [float(x) for x in vec])
    return out


Ranked = list[tuple[str, int, float]]   # (doc_id, position, score), best first


def _cosine(con: Any, vector: list[float], dim: int, limit: int) -> Ranked:
    rows = con.execute(f"""
        SELECT doc_id, position, score FROM (
            SELECT doc_id, position,
                   array_cosine_similarity(embedding, ?::FLOAT[{dim}]) AS score
            FROM chunks)
        WHERE NOT isnan(score)
        ORDER BY score DESC, doc_id, position
        LIMIT ?""", [vector, limit]).fetchall()
    return [(d, p, float(s)) for d, p, s in rows]


def _bm25(con: Any, query: str, limit: int) -> Ranked:
    terms = sorted(set(index_terms(query)))
    if not terms:
        return []
    rows = con.execute(f"""
        WITH q AS (SELECT DISTINCT unnest(?::VARCHAR[]) AS term),
        stats AS (SELECT count(*) AS n, avg(n_terms) AS avgdl FROM chunks),
        df AS (SELECT p.term, count(*) AS df FROM postings p JOIN q USING (term)
               GROUP BY p.term),
        scored AS (
            SELECT p.doc_id, p.position,
                   sum(ln(1 + (s.n - df.df + 0.5) / (df.df + 0.5))
                       * p.tf * ({BM25_K1} + 1)
                       / (p.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * c.n_terms
                                              / greatest(s.avgdl, 1)))) AS score
            FROM postings p
            JOIN df USING (term)
            JOIN chunks c ON c.doc_id = p.doc_id AND c.position = p.position
            CROSS JOIN stats s
            GROUP BY p.doc_id, p.position)
        SELECT doc_id, position, score FROM scored
        ORDER BY score DESC, doc_id, position
        LIMIT ?""", [terms, limit]).fetchall()
    return [(d, p, float(s)) for d, p, s in rows]


def _fuse(rankings: Iterable[Ranked]) -> Ranked:
    """Reciprocal rank fusion: ``sum(1 / (RRF_K + rank))`` over the rankings."""
    scores: dict[tuple[str, int], float] = {}
    for ranking in rankings:
        for rank, (doc_id, position, _) in enumerate(ranking, start=1):
            key = (doc_id, position)
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank)
    order = sorted(scores, key=lambda key: (-scores[key], key))
    return [(d, p, scores[(d, p)]) for d, p in order]


_DETAILS = ("doc_id", "position", "source", "start_char", "end_char", "content_hash",
            "doc_hash", "text")


def _details(con: Any, keys: list[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The stored fields of the chunks ``keys`` (one query)."""
    if not keys:
        return {}
    import pyarrow as pa

    wanted = pa.table({"doc_id": pa.array([d for d, _ in keys], pa.string()),
                       "position": pa.array([p for _, p in keys], pa.int32())})
    con.register("wanted_chunks", wanted)
    try:
        rows = con.execute(f"""
            SELECT {", ".join("c." + c for c in _DETAILS)} FROM chunks c
            JOIN wanted_chunks w ON c.doc_id = w.doc_id AND c.position = w.position
            """).fetchall()
    finally:
        con.unregister("wanted_chunks")
    return {(r[0], r[1]): dict(zip(_DETAILS, r, strict=True)) for r in rows}


def _copies(con: Any, hashes: list[str]) -> dict[str, list[Same]]:
    """Every chunk of the index with one of these texts, by content hash."""
    if not hashes:
        return {}
    rows = con.execute("""
        SELECT content_hash, doc_id, source, position FROM chunks
        WHERE list_contains(?, content_hash) ORDER BY doc_id, position""",
                       [hashes]).fetchall()
    out: dict[str, list[Same]] = {}
    for chash, doc_id, source, position in rows:
        out.setdefault(chash, []).append(Same(doc_id=doc_id, source=source,
                                              position=position))
    return out


def _hits(con: Any, query: str, mode: str, k: int, bm25: Ranked, cosine: Ranked,
          width: int, collapse: bool) -> list[Hit]:
    if mode == "keyword":
        ranked = bm25
    elif mode == "vector":
        ranked = cosine
    else:
        ranked = _fuse([bm25, cosine])
    bm25_at = {(d, p): (s, r) for r, (d, p, s) in enumerate(bm25, start=1)}
    cosine_at = {(d, p): (s, r) for r, (d, p, s) in enumerate(cosine, start=1)}
    details = _details(con, [(d, p) for d, p, _ in ranked])
    chosen: list[tuple[str, int, float]] = []
    seen: set[str] = set()
    for doc_id, position, score in ranked:
        row = details.get((doc_id, position))
        if row is None:   # removed since it was ranked (a concurrent write)
            continue
        if collapse:
            if row["content_hash"] in seen:
                continue
            seen.add(row["content_hash"])
        chosen.append((doc_id, position, score))
        if len(chosen) == k:
            break
    copies = _copies(con, sorted(seen)) if collapse else {}
    terms = set(index_terms(query))
    hits = []
    for rank, (doc_id, position, score) in enumerate(chosen, start=1):
        row = details[(doc_id, position)]
        text, marks = snippet_marks(row["text"], terms, width)
        b = bm25_at.get((doc_id, position))
        c = cosine_at.get((doc_id, position))
        same = tuple(s for s in copies.get(row["content_hash"], [])
                     if (s.doc_id, s.position) != (doc_id, position))
        hits.append(Hit(
            rank=rank, doc_id=doc_id, position=position, score=score,
            score_kind=SCORE_KIND[mode], snippet=text, source=row["source"],
            start_char=row["start_char"], end_char=row["end_char"],
            chunk_id=f"{doc_id}#{position}", content_hash=row["content_hash"],
            doc_hash=row["doc_hash"], cosine=c[0] if c else None, cosine_rank=c[1] if c else None,
            bm25=b[0] if b else None, bm25_rank=b[1] if b else None,
            rrf=score if mode == "hybrid" else None, marks=marks, same=same))
    return hits


# --------------------------------------------------------------------------- snippets


def snippet_marks(text: str, terms: Iterable[str], width: int = 200
                  ) -> tuple[str, tuple[tuple[int, int], ...]]:
    """About ``width`` characters of ``text`` around the first query term, and the terms' spans.

    Whitespace (paragraph breaks too) is collapsed to single spaces; the
    snippet starts and ends on word boundaries, with "…" where text was cut.
    The spans are ``(start, end)`` offsets of query-term words in the snippet.

    Example:
        >>> snippet_marks("Grant of\\n\\nPatent License.", {"patent"})
        ('Grant of Patent License.', ((9, 15),))
    """
    wanted = set(terms)
    flat = " ".join(text.split())
    spans = term_spans(flat, wanted)
    if len(flat) <= width:
        return flat, tuple(spans)
    start = max(0, spans[0][0] - width // 4) if spans else 0
    if start:
        space = flat.find(" ", start)
        start = space + 1 if 0 <= space < start + 30 else start
    end = min(len(flat), start + width)
    if end < len(flat):
        space = flat.rfind(" ", start, end)
        end = space if space > start else end
    prefix = "…" if start else ""
    segment = flat[start:end]
    body = segment.strip()
    first = start + len(segment) - len(segment.lstrip())   # offset of body[0] in flat
    shift = len(prefix) - first
    inside = tuple((a + shift, b + shift) for a, b in spans
                   if a >= first and b <= first + len(body))
    return prefix + body + ("…" if end < len(flat) else ""), inside


def snippet(text: str, terms: Iterable[str], width: int = 200) -> str:
    """The snippet of :func:`snippet_marks`, without the spans."""
    return snippet_marks(text, terms, width)[0]


# --------------------------------------------------------------------------- rendering


def _shown_path(hit: Hit) -> str:
    if not hit.source:
        return hit.doc_id
    try:
        return os.path.relpath(hit.source) if Path(hit.source).resolve().is_relative_to(
            Path.cwd().resolve()) else hit.source
    except ValueError:   # another drive (Windows)
        return hit.source


def _scores(hit: Hit) -> str:
    parts = []
    if hit.cosine is not None:
        parts.append(f"cosine {hit.cosine:.3f} #{hit.cosine_rank}")
    if hit.bm25 is not None:
        parts.append(f"bm25 {hit.bm25:.2f} #{hit.bm25_rank}")
    if hit.score_kind == "rrf":
        others = f" ({', '.join(parts)})" if parts else ""
        return f"rrf {hit.score:.4f}{others}"
    return parts[0] if parts else f"{hit.score_kind} {hit.score:.4f}"


def format_hit(hit: Hit, mark: tuple[str, str] = ("**", "**")) -> str:
    """One line for a hit: rank, source path, position and offsets, scores, snippet, copies.

    ``mark`` wraps each query term of the snippet (e.g. ANSI bold on a terminal).

    Example:
        ``" 1. licenses/apache-2.0.txt #7 chars 5210-5998  rrf 0.0325 (cosine 0.412 #2,
        bm25 9.87 #1)  …3. Grant of **Patent** **License**. Subject to…  +1 same"``
    """
    text = hit.snippet
    for a, b in reversed(hit.marks):
        text = text[:a] + mark[0] + text[a:b] + mark[1] + text[b:]
    where = f"#{hit.position}"
    if hit.start_char is not None and hit.end_char is not None:
        where += f" chars {hit.start_char}-{hit.end_char}"
    line = f"{hit.rank:>2}. {_shown_path(hit)} {where}  {_scores(hit)}  {text}"
    if hit.same:
        line += f"  +{len(hit.same)} same"
    return line


def hit_json(hit: Hit) -> dict[str, Any]:
    """A hit as JSON-ready data (every field; ``same`` as a list of objects)."""
    data = asdict(hit)
    data["marks"] = [list(m) for m in hit.marks]
    return data
