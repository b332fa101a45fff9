"""The README's Python paths: the Ten lines pipeline from Python (the calls its prose names, in a
fresh interpreter) and the task state diagram, which must be the one the table generates."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerflow.states import mermaid

from . import cli
from .readme import blocks, section

CALLS = ["run = squares.run(n=5)", "run.result()", "run.status()",
         "ledgerflow.resume(run.run_id)", "ledgerflow.runs()"]

SCRIPT = """
import json, ledgerflow
from flows import squares
run = squares.run(n=5)
out = {"result": run.result(), "state": run.status().state,
       "keys": sorted(run.status().tasks)}
try:
    ledgerflow.resume(run.run_id)
except ledgerflow.errors.NotResumableError as exc:   # it succeeded: nothing to resume
    out["resume"] = str(exc)
out["runs"] = [r.run_id for r in ledgerflow.runs()]
out["run_id"] = run.run_id
print(json.dumps(out))
"""


@pytest.mark.subprocess
def test_ten_lines_from_python(tmp_path: Path) -> None:
    prose = re.sub(r"\s+", " ", section("Ten lines"))
    for call in CALLS:                                   # the calls the README names
        assert f"`{call}`" in prose, call
    (tmp_path / "flows.py").write_text(blocks("Ten lines", "python")[0])
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=cli.env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["result"] == [0, 1, 4, 9, 16] and out["state"] == "succeeded"
    assert out["keys"] == sorted(["fetch"] + [f"square[{i}]" for i in range(5)])
    assert "succeeded" in out["resume"]
    assert out["runs"] == [out["run_id"]]
    assert (tmp_path / ".ledgerflow" / "ledger.duckdb").is_file()   # the default ledger


def test_the_state_diagram_is_the_table() -> None:
    (diagram,) = blocks("Task state machine", "mermaid")
    assert diagram.strip() == mermaid().strip()
