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
    env.update(IPYTHONDIR=str(tmp_path / "ipython"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "notebooks/",
           "--nbval-kernel-name", "python3",
           "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
           "-p", "no:cacheprovider", "-q"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
