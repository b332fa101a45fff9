"""discover, read, clean and chunk of the doc_index recipe (plain calls, no kernel)."""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from pathlib import Path

import doc_index_text as text
import pytest
from doc_index_testutil import CORPUS

from ledgerflow import NonRetryableError, context

# --------------------------------------------------------------------------- discover


def test_discover_bundled_corpus_lists_every_document_sorted_with_hashes(recipe) -> None:
    docs = recipe.discover(str(CORPUS))
    ids = [d["doc_id"] for d in docs]
    assert ids == sorted(ids)
    assert 30 <= len(docs) <= 50
    formats = {f: sum(d["format"] == f for d in docs) for f in ("text", "markdown", "html", "pdf")}
    assert formats["pdf"] >= 3 and all(formats.values()), formats
    for d in docs:
        path = Path(d["path"])
        assert path.is_absolute() and path.relative_to(CORPUS).as_posix() == d["doc_id"]
        assert d["content_hash"] == hashlib.sha256(path.read_bytes()).hexdigest()
    total = sum(Path(d["path"]).stat().st_size for d in docs)
    assert total < 2_000_000


def test_discover_is_recursive_and_skips_hidden_and_unsupported(recipe, small_corpus) -> None:
    docs = recipe.discover(str(small_corpus))
    assert [(d["doc_id"], d["format"]) for d in docs] == [
        ("alpha.txt", "text"), ("beta.md", "markdown"), ("sub/gamma.html", "html"),
        ("sub/notes.txt", "text")]


def test_discover_exclude_patterns_and_single_file(recipe, small_corpus) -> None:
    docs = recipe.discover(str(small_corpus), ["sub/*", "beta.md"])
    assert [d["doc_id"] for d in docs] == ["alpha.txt"]
    one = recipe.discover(str(small_corpus / "beta.md"))
    assert [d["doc_id"] for d in one] == ["beta.md"]


def test_discover_missing_source_is_not_retried(recipe, tmp_path) -> None:
    with pytest.raises(NonRetryableError, match="does not exist"):
        recipe.discover(str(tmp_path / "nope"))


def test_discover_ids_stay_stable_when_a_document_is_added(recipe, small_corpus) -> None:
    before = {d["doc_id"]: d["content_hash"] for d in recipe.discover(str(small_corpus))}
    (small_corpus / "aardvark.txt").write_text("new")
    after = {d["doc_id"]: d["content_hash"] for d in recipe.discover(str(small_corpus))}
    assert {k: after[k] for k in before} == before


# --------------------------------------------------------------------------- read


def test_read_text_and_records_lineage(recipe, small_corpus) -> None:
    doc = recipe.discover(str(small_corpus))[0]
    lineage = context().lineage
    before = len(lineage)
    out = recipe.read(doc)
    assert out["text"].startswith("Alpha particles")
    assert out["doc_id"] == "alpha.txt" and out["content_hash"] == doc["content_hash"]
    kind, uri, digest, attrs = lineage[before]
    assert (kind, digest) == ("input", doc["content_hash"])
    assert uri.startswith("file://") and uri.endswith("alpha.txt")
    assert attrs["doc_id"] == "alpha.txt"


def test_read_pdf_extracts_text(recipe) -> None:
    doc = next(d for d in recipe.discover(str(CORPUS)) if d["doc_id"] == "pdf/heapq-theory.pdf")
    out = recipe.read(doc)
    assert "tournament" in out["text"]


def test_read_refuses_a_file_changed_after_discover(recipe, small_corpus) -> None:
    doc = recipe.discover(str(small_corpus))[0]
    (small_corpus / "alpha.txt").write_text("changed")
    with pytest.raises(NonRetryableError, match="changed after discover"):
        recipe.read(doc)


def test_read_corrupt_pdf_is_not_retried(recipe, tmp_path) -> None:
    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    doc = recipe.discover(str(tmp_path))[0]
    with pytest.raises(NonRetryableError, match=r"bad\.pdf"):
        recipe.read(doc)


def test_decode_falls_back_for_legacy_encodings() -> None:
    assert text.decode_text("café".encode("cp1252")) == "café"
    assert text.decode_text("\ufeffcafé".encode()) == "café"


# --------------------------------------------------------------------------- clean


def test_clean_unicode_nfkc_and_whitespace() -> None:
    raw = "\ufb01ne  \uff26\uff55\uff4c\uff4c\u00a0width\tand\u200b zero\r\nwidth\n\n\n\nnext   para \x07"
    assert text.clean_text(raw) == "fine Full width and zero width\n\nnext para"


def test_clean_html_drops_scripts_styles_and_tags() -> None:
    raw = ("<html><head><title>T &amp; C</title><style>.a{color:red}</style>"
           "<script>var x = 1;</script></head><body><h1>Head</h1><p>One&nbsp;<b>two</b>"
           "</p><ul><li>three</li><li>four</li></ul><!-- hidden --></body></html>")
    assert text.clean_text(raw, "html") == "T & C\n\nHead\n\nOne two\n\nthree\n\nfour"


def test_clean_markdown_keeps_words_not_syntax() -> None:
    raw = ("---\ntitle: x\n---\n# Heading\n\nSome *emphasis*, __strong__ and `code` with "
           "snake_case_name, a [link](http://x.org) and ![alt text](i.png).\n\n"
           "- item one\n- item two\n\n> quoted\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
           "```python\nx = 1  # comment\n```\n")
    out = text.clean_text(raw, "markdown")
    assert "Heading" in out and "#" not in out.split("x = 1")[0]
    assert "Some emphasis, strong and code with snake_case_name, a link and alt text." in out
    assert "item one item two" in out and "quoted" in out
    assert "x = 1 # comment" in out
    for token in ("*", "](", "```", "|", "---"):
        assert token not in out


def test_clean_task_keeps_document_fields(recipe) -> None:
    doc = {"doc_id": "a.html", "path": "/a.html", "content_hash": "h", "format": "html",
           "text": "<p>x</p>"}
    assert recipe.clean(doc) == {**doc, "text": "x"}


def test_clean_corpus_documents_have_no_markup(recipe) -> None:
    for doc in recipe.discover(str(CORPUS)):
        if doc["format"] in ("html", "markdown"):
            out = recipe.clean(recipe.read(doc))["text"]
            assert not re.search(r"</?[a-z]+[ >]", out), doc["doc_id"]
            assert len(out) > 100


# --------------------------------------------------------------------------- chunk


def _check_chunks(source: str, chunks: list[text.Chunk], size: int, overlap: int) -> None:
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", source)]
    covered = set()
    for i, c in enumerate(chunks):
        assert c.position == i
        assert c.text == source[c.start:c.end]
        assert c.content_hash == hashlib.sha256(c.text.encode()).hexdigest()
        # never inside a word: both ends fall on whitespace (or the text's ends)
        assert c.start == 0 or source[c.start - 1].isspace()
        assert c.end == len(source) or source[c.end].isspace()
        assert not c.text[0].isspace() and not c.text[-1].isspace()
        if len(c.text) > size:
            assert len(c.text.split()) == 1  # only a single over-long word may exceed
        covered.update(w for w in words if c.start <= w[0] and w[1] <= c.end)
        if i:
            prev = chunks[i - 1]
            assert c.start > prev.start and c.end > prev.end
            assert max(0, prev.end - c.start) <= overlap  # overlap respected
    assert covered == set(words)  # every word is in some chunk


def test_chunk_example() -> None:
    chunks = text.chunk_text("one two three four five", size=9, overlap=4)
    assert [c.text for c in chunks] == ["one two", "two three", "four five"]


@pytest.mark.parametrize("size,overlap", [(50, 0), (50, 20), (200, 60), (800, 100)])
def test_chunk_random_texts_never_split_words_and_respect_overlap(size, overlap) -> None:
    rng = random.Random(size * 1000 + overlap)
    for _ in range(30):
        words = ["".join(rng.choices("abcdefghij", k=rng.randint(1, 14)))
                 for _ in range(rng.randint(0, 300))]
        seps = [rng.choice([" ", " ", " ", "\n\n", ". "]) for _ in words]
        source = "".join(w + s for w, s in zip(words, seps, strict=True)).strip()
        _check_chunks(source, text.chunk_text(source, size, overlap), size, overlap)


def test_chunk_overlap_repeats_trailing_words() -> None:
    source = " ".join(f"w{i:03d}" for i in range(200))
    chunks = text.chunk_text(source, size=100, overlap=30)
    _check_chunks(source, chunks, 100, 30)
    for prev, nxt in itertools.pairwise(chunks):
        shared = prev.end - nxt.start
        assert 20 <= shared <= 30  # as many whole words as fit in 30 characters
        assert prev.text.endswith(nxt.text[:shared])


def test_chunk_prefers_paragraph_breaks() -> None:
    para = "word " * 30
    source = (para.strip() + ".\n\n") * 4
    chunks = text.chunk_text(source.strip(), size=400, overlap=0)
    assert all(c.text.endswith(".") for c in chunks)


def test_chunk_keeps_an_overlong_word_whole() -> None:
    long_word = "x" * 120
    source = f"short words {long_word} more words after it"
    chunks = text.chunk_text(source, size=50, overlap=10)
    _check_chunks(source, chunks, 50, 10)
    assert any(c.text == long_word for c in chunks)


def test_chunk_empty_text_and_bad_parameters(recipe) -> None:
    assert text.chunk_text("   ", 10, 2) == []
    with pytest.raises(ValueError, match="overlap"):
        text.chunk_text("a b", 10, 10)
    with pytest.raises(ValueError, match="size"):
        text.chunk_text("a b", 0, 0)
    doc = {"doc_id": "d", "path": "/d", "content_hash": "h", "format": "text", "text": "a b"}
    with pytest.raises(NonRetryableError, match="overlap"):
        recipe.chunk(doc, size=10, overlap=-1)


def test_chunk_corpus_documents(recipe) -> None:
    for doc in recipe.discover(str(CORPUS))[:12]:
        cleaned = recipe.clean(recipe.read(doc))
        out = recipe.chunk(cleaned, size=300, overlap=50)
        assert out["doc_id"] == doc["doc_id"] and out["doc_hash"] == doc["content_hash"]
        chunks = [text.Chunk(**c) for c in out["chunks"]]
        _check_chunks(cleaned["text"], chunks, 300, 50)
