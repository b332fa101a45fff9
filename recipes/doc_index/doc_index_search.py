"""Search a doc_index index from a shell (a thin wrapper of :mod:`ledgerflow_docindex.search`).

    python recipes/doc_index/doc_index_search.py INDEX "query" [-k 5] [--mode hybrid] [--json]
    python recipes/doc_index/doc_index_search.py INDEX --explain DOC_ID POSITION

The same search is ``pipeline search INDEX "query" ["query" ...]`` (several queries,
or one per line on stdin, in one process). As functions::

    from doc_index_search import search          # = ledgerflow_docindex.search.search
    for hit in search("index.duckdb", "patent grant", k=3):
        print(hit.rank, hit.doc_id, hit.position, hit.score_kind, round(hit.score, 4))
"""

from __future__ import annotations

import argparse
import json
import sys

from ledgerflow_docindex import store
from ledgerflow_docindex.search import (  # noqa: F401  (re-exported)
    MODES,
    Hit,
    Same,
    SearchError,
    format_hit,
    hit_json,
    search,
    search_many,
    snippet,
    snippet_marks,
)


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
    from ledgerflow.errors import PipelineError

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
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 2
    except ValueError as exc:   # e.g. a POSITION that is not a number
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([hit_json(h) for h in hits], indent=2))
    elif not hits:
        print("no matches")
    else:
        # query terms in bold on a terminal; plain text in a pipe or a log (no raw markers)
        mark = ("\x1b[1m", "\x1b[22m") if sys.stdout.isatty() else ("", "")
        for h in hits:
            print(format_hit(h, mark))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
