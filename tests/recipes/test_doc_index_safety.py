"""The recipe's first hour and its safety: a missing source, symlinks out of the folder,
and a model load that says what it is doing, once per process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import doc_index_text as text
import pytest
from doc_index_testutil import PIPELINE_FILE, rows

import ledgerflow
from ledgerflow.errors import InputError
from ledgerflow_docindex.search import search

SMALL = {"chunk_size": 80, "overlap": 0}


def _cli(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=600, env=env)


# --------------------------------------------------------------------------- a missing source


@pytest.mark.subprocess
def test_a_missing_source_is_refused_before_the_run_starts(tmp_path: Path) -> None:
    out = _cli("run", str(PIPELINE_FILE), "-p", "source=nowhere/", "-p", "index=idx.duckdb",
               "--store", "ledger.duckdb", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "run " not in out.stdout   # no run id printed
    error, hint = out.stderr.splitlines()[-2:]
    assert error == (f"Error: source 'nowhere/' does not exist (looked in "
                     f"{tmp_path.resolve() / 'nowhere'})")
    assert hint.startswith("Hint: pass a folder or file of documents: -p source=DOCS")
    assert not (tmp_path / "idx.duckdb").exists()       # no empty index left behind
    assert not (tmp_path / "ledger.duckdb").exists()    # and nothing recorded


def test_a_missing_source_is_refused_from_python_too(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"source .* does not exist"):
        ledgerflow.run(str(PIPELINE_FILE), source=str(tmp_path / "gone"),
                       index=str(tmp_path / "idx.duckdb"), store=str(tmp_path / "l.duckdb"))
    assert not (tmp_path / "idx.duckdb").exists()


# --------------------------------------------------------------------------- symlinks


def _folder_with_symlinks(tmp_path: Path) -> Path:
    src, outside = tmp_path / "docs", tmp_path / "outside"
    src.mkdir()
    outside.mkdir()
    (src / "a.txt").write_text("Notes on alpha particles.\n\nMore about helium nuclei.\n")
    (outside / "secret.txt").write_text("The zebracorn password is hunter2.\n")
    (src / "leak.txt").symlink_to(outside / "secret.txt")    # out of the folder: skipped
    (src / "inside.txt").symlink_to(src / "a.txt")           # inside the folder: indexed
    if Path("/etc/passwd").exists():
        (src / "passwd.txt").symlink_to("/etc/passwd")
    return src


def test_discover_skips_symlinks_out_of_the_folder(tmp_path: Path) -> None:
    src = _folder_with_symlinks(tmp_path)
    skipped: list[tuple[str, str]] = []
    docs = text.discover_documents(src, skipped=skipped)
    assert [d["doc_id"] for d in docs] == ["a.txt", "inside.txt"]
    expected = [("leak.txt", str((tmp_path / "outside" / "secret.txt").resolve()))]
    if Path("/etc/passwd").exists():
        expected.append(("passwd.txt", str(Path("/etc/passwd").resolve())))
    assert sorted(skipped) == sorted(expected)


def test_a_symlink_to_a_file_outside_the_source_is_not_indexed(tmp_path: Path) -> None:
    src, index = _folder_with_symlinks(tmp_path), tmp_path / "index.duckdb"
    run = ledgerflow.run(str(PIPELINE_FILE), source=str(src), index=str(index),
                         store=str(tmp_path / "l.duckdb"), **SMALL)
    assert run.state == "succeeded"
    assert {doc for doc, *_ in rows(index)} == {"a.txt", "inside.txt"}
    assert search(index, "zebracorn password hunter2", k=5, mode="keyword") == []
    assert all(h.doc_id != "passwd.txt" for h in search(index, "root bin bash", k=5))
    log = "".join(entry["text"] for entry in run.logs("discover"))
    assert (f"skipped leak.txt: a symlink to {(tmp_path / 'outside' / 'secret.txt').resolve()}"
            ", outside the source folder (not indexed)") in log


# --------------------------------------------------------------------------- the model load


def test_pipeline_search_loads_the_model_once_and_says_so(
        tmp_path: Path, small_corpus: Path, slow_hashing) -> None:
    from click.testing import CliRunner
    from doc_index_testutil import build_locally

    import ledgerflow_embed
    from ledgerflow.cli import main

    index = tmp_path / "index.duckdb"
    build_locally(small_corpus, index, embedder="slow-hashing")
    ledgerflow_embed.clear_cache()        # a new process, as far as embedders go
    result = CliRunner().invoke(main, ["search", str(index), "-k", "1"],
                                input="gamma rays\nhelium nuclei\n\nneutron proton\n")
    assert result.exit_code == 0, result.output
    assert [line for line in result.stdout.splitlines() if line.startswith("# ")] == [
        "# gamma rays", "# helium nuclei", "# neutron proton"]
    said = result.stderr.splitlines()
    assert said.count("loading the embedding model slow-hashing (a test model) ...") == 1
    assert len([s for s in said if s.startswith("loaded the embedding model slow-hashing in ")
                ]) == 1
    assert "loading" not in result.stdout


@pytest.mark.minilm
@pytest.mark.subprocess
def test_minilm_says_it_loads_in_the_task_log_and_once_in_pipeline_search(
        tmp_path: Path) -> None:
    import ledgerflow_embed

    src = tmp_path / "docs"
    src.mkdir()
    (src / "cats.txt").write_text("A cat sat on the mat and purred.\n")
    (src / "stocks.txt").write_text("Stock markets fell sharply today.\n")
    index = tmp_path / "index.duckdb"
    ledgerflow_embed.clear_cache()        # this process loads it again, as a new worker would
    run = ledgerflow.run(str(PIPELINE_FILE), source=str(src), index=str(index),
                         embedder="minilm", store=str(tmp_path / "l.duckdb"))
    assert run.state == "succeeded"
    logs = "".join(e["text"] for e in run.logs() if e["task_key"].startswith("embed"))
    assert logs.count("loading the embedding model minilm "
                      "(sentence-transformers/all-MiniLM-L6-v2) ...") == 1   # once a process
    assert "loaded the embedding model minilm in " in logs

    out = _cli("search", str(index), "-k", "1", cwd=tmp_path,
               stdin="a kitten on a rug\nshares dropped\nfeline\n")
    assert out.returncode == 0, out.stderr
    heads = [line for line in out.stdout.splitlines() if line.startswith("# ")]
    assert heads == ["# a kitten on a rug", "# shares dropped", "# feline"]
    assert out.stderr.count("loading the embedding model minilm") == 1
    first = out.stdout.split("# shares dropped")
    assert "cats.txt" in first[0] and "stocks.txt" in first[1].split("# feline")[0]
