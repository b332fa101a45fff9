"""Two runs on one index at once: each chunk is embedded once; other executors.

Two real ``pipeline run`` processes, started together on the same folder and
index: the second one finds what the first embedded (it waits for the
embedding lock instead of embedding the same chunks again), and the index is
the same as one run would leave.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from doc_index_testutil import PIPELINE_FILE, RECIPE_DIR, ROOT, build_locally, rows

import ledgerflow

CONTENT = "doc_id, position, content_hash, doc_hash, text, embedding, embedder_version"

WRAPPER = textwrap.dedent("""
    # The recipe with the slowed-down test embedder registered.
    import sys
    sys.path.insert(0, {tests!r})
    import doc_index_testutil
    from ledgerflow.control import load_module

    doc_index_testutil.register_slow_hashing()
    doc_index = load_module(doc_index_testutil.PIPELINE_FILE).doc_index
""")


def _corpus(root: Path, n: int = 8) -> Path:
    src = root / "docs"
    src.mkdir()
    for i in range(n):
        (src / f"doc{i}.txt").write_text("\n\n".join(
            f"Document {i} paragraph {j} says something about topic {i * 10 + j}."
            for j in range(3)) + "\n")
    return src


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_runs_at_once_embed_each_chunk_once(tmp_path: Path) -> None:
    src = _corpus(tmp_path)
    wrapper = tmp_path / "slow_doc_index.py"
    wrapper.write_text(WRAPPER.format(tests=str(ROOT / "tests" / "recipes")))
    index = tmp_path / "index.duckdb"
    marker = tmp_path / "embedded.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(DOC_INDEX_TEST_MARKER=str(marker), DOC_INDEX_TEST_DELAY="0.15",
               PYTHONPATH=os.pathsep.join([str(RECIPE_DIR), *sys.path]))
    cmd = [sys.executable, "-m", "ledgerflow", "run", str(wrapper), "-p", f"source={src}",
           "-p", f"index={index}", "-p", "embedder=slow-hashing", "-p", "chunk_size=80",
           "-p", "overlap=0", "--workers", "2"]
    ledger = str(tmp_path / "ledger.duckdb")   # the same command, started twice
    procs = [subprocess.Popen([*cmd, "--store", ledger], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, out + err

    views = ledgerflow.runs(store=ledger)
    assert len(views) == 2 and all(v.state == "succeeded" for v in views)
    spans = []
    for view in views:
        run = ledgerflow.get_run(view.run_id, store=ledger)
        embeds = [a for a in run.attempts() if a["task_key"].startswith("embed[")]
        assert len(embeds) == 8          # both runs really ran their embed tasks ...
        spans.append((min(a["started_at"] for a in embeds),
                      max(a["ended_at"] for a in embeds)))
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]   # ... at the same time

    n_chunks = len(rows(index))
    assert n_chunks == 8 * 3
    embedded = sum(int(n) for n in marker.read_text().split())
    assert embedded == n_chunks          # each chunk once, not twice
    fresh = tmp_path / "fresh.duckdb"
    import doc_index_testutil

    doc_index_testutil.register_slow_hashing()
    build_locally(src, fresh, embedder="slow-hashing", size=80, overlap=0)
    assert rows(index, CONTENT) == rows(fresh, CONTENT)


@pytest.mark.slow
def test_the_processes_executor_builds_the_same_index(tmp_path: Path) -> None:
    """Verification runs in the driver, embedding and writes in worker processes."""
    src = _corpus(tmp_path, n=4)
    index, ledger = tmp_path / "index.duckdb", tmp_path / "ledger.duckdb"
    params = {"source": str(src), "index": str(index), "store": str(ledger),
              "chunk_size": 80, "overlap": 0}
    first = ledgerflow.run(str(PIPELINE_FILE), executor="processes", workers=2, **params)
    assert first.state == "succeeded"
    (src / "doc1.txt").unlink()
    ledgerflow.run(str(PIPELINE_FILE), executor="processes", workers=2, **params)
    (src / "doc1.txt").write_text("\n\n".join(
        f"Document 1 paragraph {j} says something about topic {10 + j}." for j in range(3))
        + "\n")
    restored = ledgerflow.run(str(PIPELINE_FILE), executor="processes", workers=2, **params)
    assert restored.state == "succeeded"
    fresh = tmp_path / "fresh.duckdb"
    build_locally(src, fresh, size=80, overlap=0)
    assert rows(index, CONTENT) == rows(fresh, CONTENT)
