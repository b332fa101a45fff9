"""The notebooks under ``notebooks/``: well-formed, and executed by nbval.

CI may also run nbval directly::

    IPYTHONDIR=$(mktemp -d) JUPYTER_RUNTIME_DIR=$(mktemp -d) \\
    pytest --nbval-lax notebooks/ --nbval-kernel-name python3 \\
        --nbval-sanitize-with tests/nbval_sanitize.cfg
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHECK = "nbval-check-output"

nbformat = pytest.importorskip("nbformat")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_valid_and_stores_only_checked_outputs(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    assert book.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code
    for cell in code:
        tagged = CHECK in cell.metadata.get("tags", []) or "NBVAL_CHECK_OUTPUT" in cell.source
        if not tagged:
            assert not cell.outputs, f"{path.name}: untagged cell stores outputs:\n{cell.source}"
        else:
            assert cell.outputs, f"{path.name}: checked cell has no stored output:\n{cell.source}"
    assert "ledgerflow.duckdb" not in "".join(c.source for c in code)   # temp stores only


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("nbval") is None
                    or importlib.util.find_spec("ipykernel") is None,
                    reason="needs nbval and ipykernel (pip install -e .[dev])")
def test_notebooks_run_under_nbval(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    scratch = tmp_path / "tmp"      # the notebooks' own temporary folders go here
    scratch.mkdir()
    env.update(IPYTHONDIR=str(tmp_path / "ipython"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               PYDEVD_DISABLE_FILE_VALIDATION="1", TMPDIR=str(scratch))
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "notebooks/",
           "--nbval-kernel-name", "python3",
           "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
           "-p", "no:cacheprovider", "-q"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("nbclient") is None
                    or importlib.util.find_spec("ipykernel") is None,
                    reason="needs nbclient and ipykernel (pip install -e .[dev])")
def test_a_notebook_leaves_nothing_behind_once_its_kernel_stops(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a notebook's ledger and files live in a temporary folder that goes with its kernel
    # (nbval kills its kernels; Jupyter and nbclient stop them, which runs the clean-up)
    from nbclient import NotebookClient

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    for key in [k for k in os.environ if k.startswith("LEDGERFLOW_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    path = ROOT / "notebooks" / "01_quickstart.ipynb"
    book = nbformat.read(path, as_version=4)
    NotebookClient(book, kernel_name="python3", timeout=240,
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    assert sorted(p.name for p in scratch.glob("ledgerflow-*")) == []
    assert any("_work.name" in c.source for c in book.cells if c.cell_type == "code")
