"""A syntax error in a pipeline module shows where: file:line:column, the line, a caret."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import PIPELINE_EXE

pytestmark = pytest.mark.subprocess


@pytest.mark.parametrize("source, code, caret", [
    ("from ledgerflow import task\n\n@task\ndef a(x):\n    return x +\n", "return x +", 10),
    ("x = [1, 2\ny = 3\n", "x = [1, 2", 4),
])
def test_a_syntax_error_shows_the_line_and_a_caret(tmp_path: Path, cli_env, source: str,
                                                  code: str, caret: int) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(source)
    done = subprocess.run([PIPELINE_EXE, "run", str(flow), "--store", str(tmp_path / "l.duckdb")],
                          cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"Error: syntax error in {flow}:")
    assert lines[1] == f"  {code}"
    assert lines[2].index("^") == 2 + caret
    assert lines[3].startswith("Hint: ")
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "l.duckdb").exists()            # the ledger is untouched
