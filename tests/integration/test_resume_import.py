"""``pipeline resume`` imports the run's pipeline with the ledger file free.

A pipeline module may take seconds to import (a model library). The resume must not
hold the file meanwhile: on DuckDB a process reading the file keeps every other
process's write waiting. Here the module's import itself starts another run of
another pipeline on the same ledger, which must fold its journal into the file at
once (a one-second lock timeout), while the resume is importing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.cli import pipeline_cli

FLOW = """
import os
import subprocess
import sys

from ledgerflow import pipeline, task

if os.environ.pop("IMPORT_PROBE", None):     # the resume's import, not the first run's
    res = subprocess.run([sys.executable, "-m", "ledgerflow", "run", os.environ["OTHER"],
                          "--store", os.environ["LEDGER"], "--executor", "inline"],
                         capture_output=True, text=True,
                         env={**os.environ, "LEDGERFLOW_LOCK_TIMEOUT": "1"})
    with open(os.environ["PROBE_OUT"], "w") as fh:
        fh.write(str(res.returncode) + "\\n" + res.stderr)


@task
def gate() -> int:
    if not os.path.exists(os.environ["GO"]):
        raise ValueError("not yet")
    return 1


@pipeline
def waits():
    return gate()
"""

OTHER = """
from ledgerflow import pipeline, task


@task
def one() -> int:
    return 1


@pipeline
def other():
    return one()
"""


def test_another_process_writes_the_ledger_while_a_resume_imports_its_pipeline(
        tmp_path: Path, write_flow, cli_env: dict[str, str]) -> None:
    flow = write_flow(FLOW)
    other = write_flow(OTHER, name="other.py")
    ledger = str(tmp_path / "ledger.duckdb")
    env = {**cli_env, "GO": str(tmp_path / "go"), "OTHER": other, "LEDGER": ledger,
           "PROBE_OUT": str(tmp_path / "probe.txt")}
    res = pipeline_cli("run", flow, "--store", ledger, "--json", env=env)
    assert res.returncode == 1, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    Path(env["GO"]).write_text("")
    res = pipeline_cli("resume", run_id, "--store", ledger, "--executor", "inline",
               env={**env, "IMPORT_PROBE": "1"})
    assert res.returncode == 0, res.stderr
    code, _, err = Path(env["PROBE_OUT"]).read_text().partition("\n")
    assert code == "0", err
    assert "was locked by another process" not in err, err     # its fold got the file
    runs = json.loads(pipeline_cli("runs", "--store", ledger, "--json", env=env).stdout)
    assert sorted(r["pipeline"] for r in runs) == ["other", "waits"]
    assert os.path.exists(ledger)
