"""Search a doc_index index: vector, keyword (BM25) or hybrid (reciprocal rank fusion).

As a function::

    from doc_index_search import search
    for hit in search("index.duckdb", "patent grant", k=3):
        print(hit.rank, hit.doc_id, hit.position, round(hit.score, 4), hit.snippet)

As a command::

    python recipes/doc_index/doc_index_search.py INDEX "query" [-k 5] [--mode hybrid] [--json]
    python recipes/doc_index/doc_index_search.py INDEX --explain DOC_ID POSITION

* ``vector``: cosine similarity between the query's embedding and every chunk's
  (``array_cosine_similarity``, brute force). The query is embedded with the
  embedder the index was built with, read from the index.
* ``keyword``: Okapi BM25 (k1=1.2, b=0.75) over the ``postings`` table, in SQL
  (terms as :func:`doc_index_text.index_terms` makes them, for chunks and query alike).
* ``hybrid``: reciprocal rank fusion of both rankings,
  ``score = sum(1 / (60 + rank))`` over the top candidates of each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import doc_index_store as store
from doc_index_text import index_terms

MODES = ("hybrid", "vector", "keyword")
BM25_K1 = 1.2
BM25_B = 0.75
RRF_K = 60


@dataclass(frozen=True, slots=True)
class Hit:
    """One ranked chunk."""

    rank: int
    doc_id: str
    position: int
    score: float
    snippet: str


class SearchError(ValueError):
    """The query or its options are invalid."""


def search(index: str | os.PathLike[str], query: str, k: int = 5, mode: str = "hybrid",
           embedder: str | None = None, *, candidates: int | None = None,
           snippet_chars: int = 200) -> list[Hit]:
    """Return the ``k`` best chunks for ``query``, best first.

    Args:
        index: the DuckDB index file written by the doc_index pipeline.
        query: free text.
        k: how many hits.
        mode: ``"hybrid"`` (default), ``"vector"`` or ``"keyword"``.
        embedder: optional; must equal the index's embedder (checked).
        candidates: how many hits of each ranking hybrid fuses (default max(50, 5k)).
        snippet_chars: length of each hit's text snippet.

    Raises:
        SearchError: empty query, bad ``k`` or ``mode``.
        store.IndexNotFoundError: no such index file.
        store.IndexMismatchError: ``embedder`` differs from the index's, or the
            installed version of that embedder differs from the one that built it.
    """
    if mode not in MODES:
        raise SearchError(f"unknown mode {mode!r}; use one of: {', '.join(MODES)}")
    if k < 1:
        raise SearchError(f"k must be at least 1, given: {k}")
    if not query or not query.strip():
        raise SearchError("the query is empty")
    pool = candidates or max(50, 5 * k)
    with store.connect(index, create=False) as con:
        meta = store.read_meta(con)
    if not meta:
        raise store.IndexMismatchError(f"{str(index)!r} is not a doc_index index (no meta table)")
    vector = _query_vector(meta, query, embedder, str(index)) if mode != "keyword" else None
    with store.connect(index, create=False) as con:
        keyword_hits = _bm25(con, query, pool if mode == "hybrid" else k) \
            if mode != "vector" else []
        vector_hits = _cosine(con, vector, int(meta["dim"]), pool if mode == "hybrid" else k) \
            if vector is not None else []
    if mode == "keyword":
        ranked = keyword_hits
    elif mode == "vector":
        ranked = vector_hits
    else:
        ranked = _fuse([keyword_hits, vector_hits])
    terms = index_terms(query)
    return [Hit(rank, doc_id, position, score, snippet(text, terms, snippet_chars))
            for rank, (doc_id, position, score, text) in enumerate(ranked[:k], start=1)]


def _query_vector(meta: dict[str, str], query: str, embedder: str | None,
                  index: str) -> list[float] | None:
    """Embed the query with the index's embedder; None if the vector is all zeros."""
    from ledgerflow_embed import encode, get_embedder

    built_with = meta["embedder"]
    if embedder is not None and embedder != built_with:
        raise store.IndexMismatchError(
            f"index {index!r} was built with embedder {built_with!r}, not {embedder!r}; "
            f"search it with embedder={built_with!r} (or omit embedder)")
    emb = get_embedder(built_with)
    if emb.version != meta["embedder_version"]:
        raise store.IndexMismatchError(
            f"index {index!r} was built with {built_with} version {meta['embedder_version']}, "
            f"but version {emb.version} is installed; rebuild the index (new index path) or "
            "install the version it was built with")
    vec = encode(emb, [query])[0]
    norm = float((vec * vec).sum())
    if not math.isfinite(norm) or norm == 0.0:
        return None
    return [float(x) for x in vec]


Row = tuple[str, int, float, str]


def _cosine(con: Any, vector: list[float], dim: int, limit: int) -> list[Row]:
    rows = con.execute(f"""
        SELECT doc_id, position, score, text FROM (
            SELECT doc_id, position, text,
                   array_cosine_similarity(embedding, ?::FLOAT[{dim}]) AS score
            FROM chunks)
        WHERE NOT isnan(score)
        ORDER BY score DESC, doc_id, position
        LIMIT ?""", [vector, limit]).fetchall()
    return [(d, p, float(s), t) for d, p, s, t in rows]


def _bm25(con: Any, query: str, limit: int) -> list[Row]:
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
        SELECT s.doc_id, s.position, s.score, c.text
        FROM scored s JOIN chunks c ON c.doc_id = s.doc_id AND c.position = s.position
        ORDER BY s.score DESC, s.doc_id, s.position
        LIMIT ?""", [terms, limit]).fetchall()
    return [(d, p, float(s), t) for d, p, s, t in rows]


def _fuse(rankings: list[list[Row]]) -> list[Row]:
    """Reciprocal rank fusion: ``sum(1 / (RRF_K + rank))`` over the rankings."""
    scores: dict[tuple[str, int], float] = {}
    texts: dict[tuple[str, int], str] = {}
    for ranking in rankings:
        for rank, (doc_id, position, _, text) in enumerate(ranking, start=1):
            key = (doc_id, position)
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank)
            texts[key] = text
    order = sorted(scores, key=lambda key: (-scores[key], key))
    return [(d, p, scores[(d, p)], texts[(d, p)]) for d, p in order]


def snippet(text: str, terms: list[str], width: int = 200) -> str:
    """About ``width`` characters of ``text`` around the first query term, on word bounds."""
    if len(text) <= width:
        return text
    lower = text.lower()
    hits = [i for i in (lower.find(t) for t in terms) if i >= 0]
    start = max(0, min(hits) - width // 4) if hits else 0
    if start:
        space = text.find(" ", start)
        start = space + 1 if 0 <= space < start + 30 else start
    end = min(len(text), start + width)
    if end < len(text):
        space = text.rfind(" ", start, end)
        end = space if space > start else end
    return ("…" if start else "") + text[start:end].strip() + ("…" if end < len(text) else "")


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """Command line: search an index, or explain one chunk. Returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="doc_index_search.py",
        description="Search a doc_index index (or explain where one chunk came from).")
    parser.add_argument("index", help="the index file (DuckDB) built by the doc_index pipeline")
    parser.add_argument("query", nargs="?", help="free-text query")
    parser.add_argument("-k", type=int, default=5, help="number of hits (default 5)")
    parser.add_argument("--mode", choices=MODES, default="hybrid",
                        help="ranking (default hybrid)")
    parser.add_argument("--embedder", help="must match the index's embedder (default: read it)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--explain", nargs=2, metavar=("DOC_ID", "POSITION"),
                        help="show the lineage of one chunk instead of searching")
    args = parser.parse_args(argv)
    try:
        if args.explain:
            doc_id, position = args.explain
            info = store.explain(args.index, doc_id, int(position))
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                for key, value in info.items():
                    print(f"{key:17} {value}")
            return 0
        if args.query is None:
            parser.error("give a QUERY (or --explain DOC_ID POSITION)")
        hits = search(args.index, args.query, k=args.k, mode=args.mode, embedder=args.embedder)
    except (store.DocIndexError, SearchError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from ledgerflow.errors import PipelineError

        if not isinstance(exc, PipelineError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(h) for h in hits], indent=2))
    elif not hits:
        print("no matches")
    else:
        for h in hits:
            print(f"{h.rank:>2}. {h.score:.4f}  {h.doc_id} #{h.position}")
            print(f"    {h.snippet}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
