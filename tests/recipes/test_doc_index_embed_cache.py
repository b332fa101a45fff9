"""The chunk-level embedding cache: an edit embeds only changed chunks; equal inputs once.

Counted with the ``slow-hashing`` test embedder, which appends the size of
every ``embed`` call to ``$DOC_INDEX_TEST_MARKER``.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from doc_index_testutil import PIPELINE_FILE, build_locally, rows

import ledgerflow
from ledgerflow_docindex import store

CONTENT = "doc_id, position, content_hash, doc_hash, text, embedding, embedder_version"
PARAGRAPHS = [f"Paragraph {i} talks about subject number {i} and nothing else at all."
              for i in range(12)]


@pytest.fixture()
def counted(tmp_path: Path, slow_hashing, monkeypatch) -> Path:
    """The marker file that counts embedded texts (one line per embed call)."""
    marker = tmp_path / "embedded.txt"
    monkeypatch.setenv("DOC_INDEX_TEST_MARKER", str(marker))
    return marker


def _embedded(marker: Path) -> int:
    total = sum(int(n) for n in marker.read_text().split()) if marker.exists() else 0
    marker.write_text("")
    return total


def _retried(run: ledgerflow.Run) -> list[tuple[Any, ...]]:
    """The attempts of ``run`` that did not end ok the first time, and its notices (what
    an assertion on the embed count says when a task ran twice)."""
    return [(a["task_key"], a["attempt"], a["outcome"], a["error_type"], a["error_message"])
            for t in run.tasks() for a in run.attempts(t["key"])
            if a["attempt"] > 1 or a["outcome"] != "ok"] + [
        (n["task_key"], n["kind"], n["message"]) for n in run.notices()]


def _run(src: Path, tmp_path: Path, **params: Any) -> ledgerflow.Run:
    run = ledgerflow.run(str(PIPELINE_FILE), source=str(src), index=str(tmp_path / "i.duckdb"),
                         store=str(tmp_path / "l.duckdb"), embedder="slow-hashing",
                         chunk_size=80, overlap=0, **params).settle()   # (files removed after)
    assert run.state == "succeeded", [t["error"] for t in run.tasks() if t["error"]]
    return run


def test_a_one_word_edit_embeds_only_the_changed_chunk(tmp_path: Path, counted: Path) -> None:
    src = tmp_path / "docs"
    src.mkdir()
    long_doc = src / "long.txt"
    long_doc.write_text("\n\n".join(PARAGRAPHS) + "\n")
    (src / "short.txt").write_text("A short note.\n")
    first = _run(src, tmp_path)
    n_chunks = len([r for r in rows(tmp_path / "i.duckdb") if r[0] == "long.txt"])
    assert n_chunks == 12
    assert _embedded(counted) == 13, _retried(first)

    long_doc.write_text(long_doc.read_text().replace("subject number 7", "subject numero 7"))
    edited = _run(src, tmp_path)
    assert _embedded(counted) == 1, _retried(edited)     # 1 of 12 chunks, not 12
    (reuse,) = [e for e in edited.lineage("embed[long.txt]") if "#embeddings" in e["uri"]]
    assert reuse["attrs"]["reused"] == "11" and reuse["attrs"]["embedded"] == "1"
    fresh = tmp_path / "fresh.duckdb"
    build_locally(src, fresh, embedder="slow-hashing", size=80, overlap=0)
    assert rows(tmp_path / "i.duckdb", CONTENT) == rows(fresh, CONTENT)


def test_equal_chunks_are_embedded_once(tmp_path: Path, counted: Path) -> None:
    src = tmp_path / "docs"
    src.mkdir()
    body = "\n\n".join(PARAGRAPHS[:4]) + "\n"
    (src / "a.txt").write_text(body)
    (src / "b.txt").write_text(body + "\n" + PARAGRAPHS[5] + "\n")
    # default: each chunk is embedded with its document's title, so a.txt and b.txt differ
    _run(src, tmp_path)
    assert _embedded(counted) == 4 + 5
    # titles=false: the text alone; the second document embeds only its own paragraph
    other = tmp_path / "untitled"
    other.mkdir()
    _run(src, other, titles=False)
    assert _embedded(counted) == 5
    # the same text twice inside one document: once
    (src / "c.txt").write_text(f"{PARAGRAPHS[9]}\n\n{PARAGRAPHS[9]}\n")
    _run(src, tmp_path)
    assert _embedded(counted) == 1


def test_a_deleted_index_is_rebuilt_without_embedding(tmp_path: Path, counted: Path) -> None:
    src = tmp_path / "docs"
    src.mkdir()
    (src / "a.txt").write_text("\n\n".join(PARAGRAPHS[:3]) + "\n")
    _run(src, tmp_path)
    assert _embedded(counted) == 3
    (tmp_path / "i.duckdb").unlink()
    (tmp_path / "l.duckdb").unlink()   # a new ledger too: nothing reused from the runs
    _run(src, tmp_path)
    assert _embedded(counted) == 0     # the vectors come from INDEX.embeddings.sqlite
    assert len(rows(tmp_path / "i.duckdb")) == 3


def test_prune_forgets_old_vectors_no_chunk_holds(tmp_path: Path, counted: Path) -> None:
    src = tmp_path / "docs"
    src.mkdir()
    doc = src / "a.txt"
    doc.write_text("\n\n".join(PARAGRAPHS[:3]) + "\n")
    _run(src, tmp_path)
    doc.write_text("\n\n".join(PARAGRAPHS[3:6]) + "\n")
    _run(src, tmp_path)
    cache = Path(f"{(tmp_path / 'i.duckdb').resolve()}.embeddings.sqlite")
    con = sqlite3.connect(cache)
    assert con.execute("SELECT count(*) FROM embeddings").fetchall() == [(6,)]
    con.execute("UPDATE embeddings SET created_at = ?", [time.time() - 2 * 86400])
    con.commit()
    con.close()
    _run(src, tmp_path)   # an unchanged rerun prunes: the 3 vectors of the old text go
    con = sqlite3.connect(cache)
    kept = {k for (k,) in con.execute("SELECT embed_key FROM embeddings").fetchall()}
    con.close()
    held = {k for (k,) in duckdb.connect(str(tmp_path / "i.duckdb"), read_only=True).execute(
        "SELECT embed_key FROM chunks").fetchall()}
    assert kept == held and len(kept) == 3


def test_a_version_1_index_is_upgraded(tmp_path: Path, counted: Path) -> None:
    src = tmp_path / "docs"
    src.mkdir()
    (src / "a.txt").write_text("\n\n".join(PARAGRAPHS[:3]) + "\n")
    _run(src, tmp_path)
    index = str(tmp_path / "i.duckdb")
    con = duckdb.connect(index)     # make it look like an index of the previous recipe
    con.execute("ALTER TABLE chunks DROP COLUMN embed_key")
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.close()
    (src / "b.txt").write_text("Another document.\n")
    _run(src, tmp_path)
    con = duckdb.connect(index, read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [
        (str(store.SCHEMA_VERSION),)]
    assert con.execute("SELECT count(*) FROM chunks WHERE embed_key IS NOT NULL").fetchall() \
        == [(1,)]   # b.txt's row; a.txt's rows are kept as they were
    con.close()
