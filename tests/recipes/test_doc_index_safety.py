"""The recipe's first hour and its safety: a missing source is refused before the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_index_testutil import PIPELINE_FILE

import ledgerflow
from ledgerflow.errors import InputError


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
