"""The doc_index pipeline end to end through the kernel: incremental, deletions, crash + resume."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from doc_index_search import search
from doc_index_testutil import CORPUS, PIPELINE_FILE, RECIPE_DIR, ROOT, query, rows

import ledgerflow
from ledgerflow.errors import InputError
from ledgerflow_embed import EmbedderNotFoundError
from tests.waiting import wait_until

#: What must be equal between two indexes of the same documents.
CONTENT = "doc_id, position, content_hash, doc_hash, text, embedding, embedder_version"


def _run(src: Path, index: Path, store: Path, **params: Any) -> ledgerflow.Run:
    return ledgerflow.run(str(PIPELINE_FILE), source=str(src), index=str(index),
                          store=str(store), **params)


def _executed(run: ledgerflow.Run) -> Counter[str]:
    """Task name -> how many of its tasks really executed (not reused from the cache)."""
    tasks = run.tasks()
    assert all(t["state"] == "succeeded" for t in tasks), [t for t in tasks if t["error"]]
    return Counter(t["task"] for t in tasks if not t["cached"])


def _executed_keys(run: ledgerflow.Run, name: str) -> list[str]:
    return sorted(t["key"] for t in run.tasks() if t["task"] == name and not t["cached"])


@pytest.fixture()
def corpus_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "corpus"
    shutil.copytree(CORPUS, dest)
    return dest


@pytest.mark.slow
def test_incremental_runs(corpus_copy: Path, tmp_path: Path) -> None:
    index, store = tmp_path / "index.duckdb", tmp_path / "ledger.duckdb"
    n_docs = len(list(p for p in corpus_copy.rglob("*") if p.is_file()))

    first = _run(corpus_copy, index, store)
    assert first.state == "succeeded"
    summary = first.result()
    assert summary["documents"] == n_docs and summary["deleted_chunks"] == 0
    assert _executed(first)["embed"] == n_docs
    assert len(rows(index)) == summary["chunks"]
    assert search(index, "heap tournament", k=1)[0].doc_id == "pdf/heapq-theory.pdf"

    # nothing changed: zero reads, embeds and writes
    again = _executed(_run(corpus_copy, index, store))
    assert again == Counter({"open_index": 1, "discover": 1, "prune": 1})

    # one edited document: only its chain runs
    with open(corpus_copy / "datasets" / "iris.txt", "a") as f:
        f.write("\nAn added paragraph about the famous orchid dataset.\n")
    edited = _run(corpus_copy, index, store)
    for name in ("read", "clean", "chunk", "embed", "update_index"):
        assert _executed_keys(edited, name) == [f"{name}[datasets/iris.txt]"]
    assert search(index, "orchid", k=1, mode="keyword")[0].doc_id == "datasets/iris.txt"

    # a deleted document: its chunks go, nothing is re-embedded
    (corpus_copy / "pdf" / "zen-of-python.pdf").unlink()
    deleted = _run(corpus_copy, index, store)
    assert deleted.result()["deleted_documents"] == ["pdf/zen-of-python.pdf"]
    assert _executed(deleted)["embed"] == 0
    assert query(index, "SELECT count(*) FROM chunks WHERE doc_id LIKE 'pdf/zen%'") == [(0,)]
    assert query(index, "SELECT count(*) FROM postings WHERE doc_id LIKE 'pdf/zen%'") == [(0,)]

    # a new document: only it runs
    (corpus_copy / "new.md").write_text("# Brand new\n\nA note about zebras and giraffes.\n")
    added = _run(corpus_copy, index, store)
    assert _executed_keys(added, "embed") == ["embed[new.md]"]

    # the incrementally maintained index equals a from-scratch build of the same folder
    fresh = tmp_path / "fresh.duckdb"
    _run(corpus_copy, fresh, tmp_path / "other-ledger.duckdb")
    assert rows(index, CONTENT) == rows(fresh, CONTENT)


def test_deleted_index_is_rebuilt_from_cached_embeddings(small_corpus: Path,
                                                         tmp_path: Path) -> None:
    index, store = tmp_path / "index.duckdb", tmp_path / "ledger.duckdb"
    _run(small_corpus, index, store, chunk_size=60, overlap=10)
    before = rows(index, CONTENT)
    index.unlink()
    rebuilt = _run(small_corpus, index, store, chunk_size=60, overlap=10)
    counts = _executed(rebuilt)
    assert counts["embed"] == 0 and counts["update_index"] == 4
    assert rows(index, CONTENT) == before


def test_lineage_and_explain(small_corpus: Path, tmp_path: Path) -> None:
    index = tmp_path / "index.duckdb"
    run = _run(small_corpus, index, tmp_path / "ledger.duckdb")
    lineage = run.lineage()
    inputs = [e for e in lineage if e["task_key"] == "read[alpha.txt]"
              and e["direction"] == "input" and e["uri"].startswith("file://")]
    assert len(inputs) == 1 and inputs[0]["uri"].endswith("/docs/alpha.txt")
    outputs = [e for e in lineage if e["task_key"] == "update_index[alpha.txt]"
               and e["direction"] == "output" and "#chunks" in e["uri"]]
    assert len(outputs) == 1 and outputs[0]["attrs"]["doc_id"] == "alpha.txt"

    import doc_index_store as store

    info = store.explain(index, "alpha.txt", 0)
    assert info["run_id"] == run.run_id and info["task_key"] == "update_index[alpha.txt]"
    assert info["attempt"] == 1
    assert info["doc_hash"] == inputs[0]["content_hash"]


def test_bad_parameters_are_rejected_before_the_run(small_corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(EmbedderNotFoundError, match="embedder 'nope' not found; installed: hashing"):
        _run(small_corpus, tmp_path / "i.duckdb", tmp_path / "l.duckdb", embedder="nope")
    with pytest.raises(InputError, match="overlap"):
        _run(small_corpus, tmp_path / "i.duckdb", tmp_path / "l.duckdb", overlap=5000)
    assert not (tmp_path / "i.duckdb").exists()


def test_embedder_mismatch_fails_before_embedding(small_corpus: Path, tmp_path: Path,
                                                  slow_hashing) -> None:
    index, store = tmp_path / "index.duckdb", tmp_path / "ledger.duckdb"
    _run(small_corpus, index, store)
    before = rows(index, CONTENT)
    run = ledgerflow.run(str(PIPELINE_FILE), source=str(small_corpus), index=str(index),
                         store=str(store), embedder="slow-hashing", wait=False)
    assert run.wait() == "failed"
    states = {t["key"]: (t["state"], t["error"]) for t in run.tasks()}
    state, error = states["open_index"]
    assert state == "failed" and "was built with embedder 'hashing'" in error
    assert all(s == "upstream_failed" for k, (s, _) in states.items() if k.startswith("embed["))
    assert rows(index, CONTENT) == before


def test_empty_folder_prunes_everything(small_corpus: Path, tmp_path: Path) -> None:
    index, store = tmp_path / "index.duckdb", tmp_path / "ledger.duckdb"
    _run(small_corpus, index, store)
    for p in list(small_corpus.rglob("*")):
        if p.is_file():
            p.unlink()
    result = _run(small_corpus, index, store).result()
    assert result["chunks"] == 0 and len(result["deleted_documents"]) == 4
    assert rows(index) == []


WRAPPER = textwrap.dedent("""
    # A pipeline file for the crash test: the recipe plus a slowed-down embedder.
    import sys
    sys.path.insert(0, {tests!r})
    import doc_index_testutil
    from ledgerflow.control import load_module

    doc_index_testutil.register_slow_hashing()
    doc_index = load_module(doc_index_testutil.PIPELINE_FILE).doc_index
""")


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigkill_during_embedding_then_resume(corpus_copy: Path, tmp_path: Path) -> None:
    """Kill the driver mid-embedding; `pipeline resume` finishes it: same index as no crash."""
    wrapper = tmp_path / "slow_doc_index.py"
    wrapper.write_text(WRAPPER.format(tests=str(ROOT / "tests" / "recipes")))
    index, store = tmp_path / "index.duckdb", tmp_path / "ledger.duckdb"
    marker = tmp_path / "embed-calls.txt"
    env = {**os.environ, "DOC_INDEX_TEST_MARKER": str(marker), "DOC_INDEX_TEST_DELAY": "0.15",
           "PYTHONPATH": os.pathsep.join([str(RECIPE_DIR), *sys.path])}
    cli = [sys.executable, "-m", "ledgerflow"]
    n_docs = len(list(p for p in corpus_copy.rglob("*") if p.is_file()))
    with subprocess.Popen(
            [*cli, "run", str(wrapper), "-p", f"source={corpus_copy}", "-p", f"index={index}",
             "-p", "embedder=slow-hashing", "--store", str(store), "--workers", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        first_line = proc.stdout.readline()
        run_id = first_line.split()[1]
        def embedding() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return marker.exists() and len(marker.read_text().split()) >= 10
        wait_until(embedding, timeout=120, what="embedding to start")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    calls_before = len(marker.read_text().split())
    assert calls_before < n_docs  # it really was interrupted

    status = ledgerflow.get_run(run_id, store=str(store))
    done = sum(1 for t in status.tasks() if t["task"] == "embed" and t["state"] == "succeeded")

    env["DOC_INDEX_TEST_DELAY"] = "0"
    resumed = subprocess.run([*cli, "resume", run_id, "--store", str(store)],
                             capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    final = ledgerflow.get_run(run_id, store=str(store))
    assert final.state == "succeeded"
    # succeeded embeddings were kept: only the others called the model again. An embed
    # lost with the driver after its vectors reached the embedding cache finds them
    # there, so it may call the model not at all: between one call per document not
    # embedded before the kill and one per document not recorded as embedded
    after = len(marker.read_text().split()) - calls_before
    assert n_docs - calls_before <= after <= n_docs - done, (after, calls_before, done)

    uninterrupted = tmp_path / "uninterrupted.duckdb"
    env.pop("DOC_INDEX_TEST_MARKER")
    again = subprocess.run(
        [*cli, "run", str(wrapper), "-p", f"source={corpus_copy}", "-p",
         f"index={uninterrupted}", "-p", "embedder=slow-hashing", "--store",
         str(tmp_path / "other-ledger.duckdb")],
        capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert rows(index, CONTENT) == rows(uninterrupted, CONTENT)
    dup = query(index, "SELECT count(*) FROM (SELECT doc_id, position FROM chunks "
                       "GROUP BY ALL HAVING count(*) > 1)")
    assert dup == [(0,)]
    assert query(index, "SELECT count(DISTINCT doc_id) FROM writes") == [(n_docs,)]


@pytest.mark.minilm
def test_pipeline_with_the_real_model(small_corpus: Path, tmp_path: Path) -> None:
    """The whole pipeline through the kernel with all-MiniLM-L6-v2, then a semantic search."""
    index = tmp_path / "index.duckdb"
    run = _run(small_corpus, index, tmp_path / "ledger.duckdb", embedder="minilm", workers=2)
    assert run.state == "succeeded"
    assert _executed(run)["embed"] == 4
    versions = {r[0] for r in query(index, "SELECT DISTINCT embedder_version FROM chunks")}
    assert len(versions) == 1 and "all-MiniLM-L6-v2" in versions.pop()
    hits = search(index, "light particles of high energy", k=1, mode="vector")
    assert hits[0].doc_id == "sub/gamma.html"
    again = _run(small_corpus, index, tmp_path / "ledger.duckdb", embedder="minilm")
    assert _executed(again)["embed"] == 0
