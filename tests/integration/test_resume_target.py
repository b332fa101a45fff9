"""Resume loads the pipeline the run recorded, never another one found by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ledgerflow
from ledgerflow import pipeline, task
from ledgerflow.errors import NotResumableError

FLOW = """
from ledgerflow import task, pipeline

@task
def boom() -> int:
    raise ValueError("fails on purpose")

@pipeline
def {name}():
    return boom()
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True)


def test_resume_refuses_when_the_recorded_pipeline_is_gone(tmp_path: Path, write_flow) -> None:
    ledger = str(tmp_path / "l.duckdb")
    flow = write_flow(FLOW.format(name="first"))
    res = _cli("run", flow, "--store", ledger, "--json")
    assert res.returncode == 1
    run_id = ledgerflow.runs(store=ledger)[0].run_id
    # the file now defines another pipeline; one named "first" exists in no module
    Path(flow).write_text(FLOW.format(name="second"))
    res = _cli("resume", run_id, "--store", ledger)
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip().splitlines()
    assert err[0].startswith(f"Error: cannot load pipeline 'first' of run {run_id}")
    assert err[1].startswith("Hint:") and len(err) == 2


def test_a_same_named_pipeline_of_this_process_is_not_used(tmp_path: Path, write_flow) -> None:
    ledger = str(tmp_path / "l.duckdb")
    flow = write_flow(FLOW.format(name="twin"))
    assert _cli("run", flow, "--store", ledger).returncode == 1
    run_id = ledgerflow.runs(store=ledger)[0].run_id
    Path(flow).unlink()

    @task
    def other() -> int:
        return 1

    @pipeline
    def twin():      # same name, different pipeline, defined in this process
        return other()

    try:
        ledgerflow.resume(run_id, store=ledger)
    except NotResumableError as exc:
        assert "pipeline file not found" in str(exc)
    else:
        raise AssertionError("resume drove another pipeline of the same name")
    run = ledgerflow.get_run(run_id, store=ledger).status()
    assert set(run.tasks) == {"boom"}


def test_a_submitted_run_waits_for_a_driver_and_can_be_cancelled(tmp_path: Path,
                                                                 write_flow) -> None:
    from ledgerflow import control
    ledger = str(tmp_path / "l.duckdb")
    flow = write_flow(FLOW.format(name="later").replace("raise ValueError(\"fails on purpose\")",
                                                        "return 7"))
    first = control.submit(flow, store=ledger)
    second = control.submit(flow, store=ledger)
    assert ledgerflow.get_run(first, store=ledger).status().state == "submitted"
    assert not ledgerflow.get_run(first, store=ledger).status().tasks
    run = ledgerflow.resume(first, store=ledger, executor="inline")
    assert run.state == "succeeded" and run.result() == 7
    ledgerflow.cancel(second, store=ledger)
    view = ledgerflow.get_run(second, store=ledger).status()
    assert (view.state, view.reason) == ("cancelled", "cancelled before a driver took it")
