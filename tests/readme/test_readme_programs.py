"""The README's *Program tasks* example as written: ``pdftotext`` on a PDF of the bundled corpus,
the result read back, and an unchanged input not converted twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import ledgerflow

from . import cli
from .readme import blocks

pytestmark = pytest.mark.subprocess


@pytest.mark.skipif(shutil.which("pdftotext") is None,
                    reason="pdftotext missing: ./dev installs poppler-utils")
def test_pdftotext_program_task_as_written(tmp_path: Path) -> None:
    (python,) = blocks("Program tasks", "python")
    (tmp_path / "flows.py").write_text(python)
    shutil.copy(cli.ROOT / "recipes/doc_index/corpus/pdf/zen-of-python.pdf", tmp_path / "zen.pdf")

    ran = cli.run(["pipeline", "run", "flows.py", "-p", "src=zen.pdf"], tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = cli.run_id(ran.stdout.splitlines()[0])
    assert "Beautiful is better than ugly" in (tmp_path / "out.txt").read_text()

    store = str(tmp_path / ".ledgerflow" / "ledger.duckdb")
    result = ledgerflow.get_run(run_id, store=store).result()
    assert result["exit_code"] == 0 and result["signal"] is None
    assert result["argv"] == ["pdftotext", "-layout", "zen.pdf", "out.txt"]
    ((path, digest),) = result["outputs"].items()          # {path: content hash}
    assert Path(path).resolve() == (tmp_path / "out.txt").resolve() and digest

    # the same file again: its content is in the fingerprint, so nothing is converted twice
    again = cli.run(["pipeline", "run", "flows.py", "-p", "src=zen.pdf"], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    (task,) = cli.json_of(["pipeline", "status", cli.run_id(again.stdout)], tmp_path)["tasks"]
    assert task["cached"] is True and task["attempts"] == 0
