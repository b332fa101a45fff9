"""The recipe's optional steps: a person confirms deletions, pdftotext reads PDFs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doc_index_testutil import CORPUS, PIPELINE_FILE, ROOT, rows

import ledgerflow

SMALL = {"chunk_size": 80, "overlap": 0}


def _docs(tmp_path: Path) -> Path:
    src = tmp_path / "docs"
    src.mkdir()
    for name, words in (("a.txt", "alpha particles"), ("b.txt", "beta decay"),
                        ("c.txt", "gamma rays")):
        (src / name).write_text(f"Notes on {words}.\n\nMore about {words} here.\n")
    return src


def _run(src: Path, index: Path, ledger: Path, **params: object) -> ledgerflow.Run:
    return ledgerflow.run(str(PIPELINE_FILE), source=str(src), index=str(index),
                          store=str(ledger), **SMALL, **params)


def _documents(index: Path) -> set[str]:
    return {doc for doc, *_ in rows(index)}


def test_confirm_prune_asks_before_deleting_and_a_refusal_keeps_them(tmp_path: Path) -> None:
    src, index, ledger = _docs(tmp_path), tmp_path / "index.duckdb", tmp_path / "l.duckdb"
    first = _run(src, index, ledger, confirm_prune=True)
    assert first.state == "succeeded" and first.approvals() == []   # nothing to delete
    (src / "b.txt").unlink()
    waiting = _run(src, index, ledger, confirm_prune=True)
    assert waiting.state == "waiting"
    (req,) = waiting.approvals(pending_only=True)
    assert req["task_key"] == "prune" and "b.txt" in req["summary"]
    assert "b.txt" in _documents(index)                          # nothing deleted yet
    waiting.reject("prune", reason="b is still needed")
    refused = ledgerflow.resume(waiting.run_id, store=str(ledger))
    assert refused.state == "failed"
    (prune,) = [t for t in refused.tasks() if t["key"] == "prune"]
    assert "rejected" in prune["error"] and "b is still needed" in prune["error"]
    assert _documents(index) == {"a.txt", "b.txt", "c.txt"}      # the index keeps it


def test_confirm_prune_from_the_command_line(tmp_path: Path) -> None:
    src, index, ledger = _docs(tmp_path), tmp_path / "index.duckdb", tmp_path / "l.duckdb"
    cli = [sys.executable, "-m", "ledgerflow"]
    params = ["-p", f"source={src}", "-p", f"index={index}", "-p", "chunk_size=80",
              "-p", "overlap=0", "-p", "confirm_prune=true", "--store", str(ledger)]

    def pipeline(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=180,
                              cwd=ROOT)

    assert pipeline("run", str(PIPELINE_FILE), *params).returncode == 0
    (src / "c.txt").unlink()
    started = pipeline("run", str(PIPELINE_FILE), *params, "--json")
    assert started.returncode == 3, started.stderr                  # waiting for a person
    run_id = json.loads(started.stdout)["run_id"]
    listed = json.loads(pipeline("approvals", run_id, "--store", str(ledger),
                                 "--json").stdout)
    (req,) = listed
    assert "c.txt" in req["summary"]
    ok = pipeline("approve", run_id, "prune", "--digest", req["digest"][:12],
                  "--reason", "c was retired", "--store", str(ledger))
    assert ok.returncode == 0, ok.stderr
    done = pipeline("resume", run_id, "--store", str(ledger))
    assert done.returncode == 0, done.stderr
    assert _documents(index) == {"a.txt", "b.txt"}


def test_an_unknown_pdf_reader_is_refused_before_anything_runs(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "ledgerflow", "run", str(PIPELINE_FILE),
                          "-p", f"source={_docs(tmp_path)}", "-p", "pdf_reader=acrobat",
                          "--store", str(tmp_path / "l.duckdb")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2
    assert "unknown pdf_reader 'acrobat'" in res.stderr and "pdftotext" in res.stderr
    assert not (tmp_path / "index.duckdb").exists()


@pytest.mark.skipif(shutil.which("pdftotext") is None,
                    reason="pdftotext is not installed (Debian package poppler-utils)")
def test_pdftotext_reads_the_pdfs_as_a_program_step(tmp_path: Path) -> None:
    src = tmp_path / "docs"
    shutil.copytree(CORPUS / "pdf", src)
    index, ledger = tmp_path / "index.duckdb", tmp_path / "l.duckdb"
    run = _run(src, index, ledger, pdf_reader="pdftotext")
    assert run.state == "succeeded"
    texts = " ".join(t for (t,) in rows(index, "text"))
    assert "SequenceMatcher" in texts
    assert _documents(index) == {p.name for p in (CORPUS / "pdf").glob("*.pdf")}
    with_pypdf = _run(src, tmp_path / "pypdf.duckdb", ledger)
    # another reader is another input: every read ran again, none was reused
    assert all(not t["cached"] for t in with_pypdf.tasks() if t["task"] == "read")
