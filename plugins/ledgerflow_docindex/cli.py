"""``pipeline search``: ask a doc index one or many queries in one process.

The model is loaded once per process, so many queries (arguments, or lines
on stdin) cost one start-up. Output: one line per hit (see
:func:`ledgerflow_docindex.search.format_hit`), or ``--json``: one JSON object
per query and line (``{"query", "mode", "k", "hits": [...]}``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import click

#: The search modes (equal to ``ledgerflow_docindex.search.MODES``; kept here so
#: that the CLI starts without importing DuckDB).
MODES = ("hybrid", "vector", "keyword")
BOLD = ("\x1b[1m", "\x1b[22m")


def _stdin_queries() -> Iterator[str]:
    for line in sys.stdin:
        if line.strip():
            yield line.strip()


@click.command("search")
@click.argument("index", type=click.Path(dir_okay=False))
@click.argument("queries", nargs=-1)
@click.option("-k", type=click.IntRange(min=1), default=5, show_default=True,
              help="Hits per query.")
@click.option("--mode", type=click.Choice(MODES), default="hybrid", show_default=True,
              help="hybrid (fused rank), vector (cosine) or keyword (BM25).")
@click.option("--embedder", help="Must match the index's embedder (default: read it).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per query and line.")
@click.option("--no-collapse", is_flag=True,
              help="Keep hits whose text equals a better hit's (default: '+N same').")
@click.option("--width", type=click.IntRange(min=20), default=160, show_default=True,
              help="Snippet length in characters.")
def search_command(index: str, queries: tuple[str, ...], k: int, mode: str,
                   embedder: str | None, as_json: bool, no_collapse: bool,
                   width: int) -> None:
    """Search a doc_index INDEX; QUERIES as arguments, or one per line on stdin.

    Each hit is one line: rank, source path, chunk position and character
    offsets, its labelled scores (rrf = fused rank score of hybrid; cosine;
    bm25) and a snippet with the query terms marked; "+N same" counts other
    chunks with the same text, collapsed into this one.

    \b
    Example:
      pipeline search index.duckdb "patent grant" "warranty disclaimer" -k 3
      printf 'patent grant\\nheap invariant\\n' | pipeline search index.duckdb --json
    """
    from ledgerflow.errors import PipelineError

    from .search import format_hit, hit_json, search_many

    mark = BOLD if sys.stdout.isatty() else ("**", "**")
    from_stdin = not queries or queries == ("-",)
    asked: Any = _stdin_queries() if from_stdin else [list(queries)]
    if from_stdin:
        asked = ([q] for q in asked)   # answer each line as it comes
    several = from_stdin or len(queries) > 1
    first = True
    try:
        for batch in asked:
            results = search_many(index, batch, k, mode, embedder,
                                  snippet_chars=width, collapse=not no_collapse)
            for query, hits in zip(batch, results, strict=True):
                if as_json:
                    click.echo(json.dumps({"query": query, "mode": mode, "k": k,
                                           "hits": [hit_json(h) for h in hits]}))
                    continue
                if several:
                    click.echo(("" if first else "\n") + f"# {query}")
                first = False
                for hit in hits:
                    click.echo(format_hit(hit, mark))
                if not hits:
                    click.echo("no matches")
            sys.stdout.flush()
    except PipelineError as exc:
        click.echo(f"Error: {exc}", err=True)
        if exc.hint:
            click.echo(f"Hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
