"""The CLI's rough edges (issue 30, item 8), each as the user meets it (in process).

No run line before a refusal; ``--debug`` never advises ``--debug``; ``cancel``
and ``submit`` hint only what works on this run and this ledger; ``runs`` says
where it looked; a run's result is shown; ``status --json`` has ISO times for
tasks and attempts and a root cause; the run line counts what the graph holds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledgerflow.cli import main

FLOW = """
from ledgerflow import task, pipeline

@task
def items(n: int) -> list[int]:
    return list(range(n))

@task
def square(x: int) -> int:
    return x * x

@task
def total(xs: list) -> int:
    return sum(xs)

@task
def boom(x: int) -> int:
    raise ValueError("no good")

@pipeline
def squares(n: int = 3):
    return {"total": total(square.map(items(n))), "n": n}

@pipeline
def broken(n: int = 1):
    return boom(n)

@pipeline
def body_fails(n: int = 1):
    raise RuntimeError("the body itself")
"""

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _run(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    res = runner.invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_no_run_line_before_a_refusal(runner: CliRunner, write_flow, ledger: str) -> None:
    flow = write_flow(FLOW)
    code, out, _ = _run(runner, "run", f"{flow}:squares", "--store", ledger, "--executor",
                        "inline")
    assert code == 0 and out.startswith("run ")
    run_id = out.split()[1]
    code, out, err = _run(runner, "resume", run_id, "--store", ledger)
    assert code == 2 and "already succeeded" in err
    assert out == ""                            # no "run ... resuming" before the refusal
    garbage = str(Path(ledger).with_name("garbage.duckdb"))
    Path(garbage).write_bytes(b"not a ledger at all" * 2000)   # past any header size
    code, out, err = _run(runner, "run", f"{flow}:squares", "--store", garbage)
    assert code == 2 and "Error:" in err
    assert out == ""                            # the run was never created


def test_the_result_is_shown_and_read_back(runner: CliRunner, write_flow, ledger: str) -> None:
    flow = write_flow(FLOW)
    code, out, _ = _run(runner, "run", f"{flow}:squares", "-p", "n=4", "--store", ledger,
                        "--executor", "inline")
    assert code == 0
    assert "(2 tasks + 1 fan-out (their tasks are made as they run))" in out.splitlines()[0]
    assert "result:  {'total': 14, 'n': 4}" in out
    run_id = out.split()[1]
    code, out, _ = _run(runner, "result", run_id, "--store", ledger, "--json")
    assert code == 0 and json.loads(out) == {"total": 14, "n": 4}
    code, out, _ = _run(runner, "result", run_id, "--store", ledger, "--task", "square[3]")
    assert code == 0 and out.strip() == "9"


def test_status_json_times_are_iso_and_it_names_the_root_cause(
        runner: CliRunner, write_flow, ledger: str) -> None:
    flow = write_flow(FLOW)
    code, out, _ = _run(runner, "run", f"{flow}:broken", "--store", ledger, "--executor",
                        "inline", "--json")
    assert code == 1
    run_id = json.loads(out)["run_id"]
    assert json.loads(out)["root_cause"]["key"] == "boom"
    doc = json.loads(_run(runner, "status", run_id, "--store", ledger, "--json")[1])
    assert doc["root_cause"] == {"key": "boom", "error": "ValueError: no good"}
    task = json.loads(_run(runner, "status", run_id, "--store", ledger, "--task", "boom",
                           "--json")[1])
    times = [task["started_at"], task["ended_at"]] + [
        a[k] for a in task["attempts"] for k in ("started_at", "ended_at")]
    assert times and all(ISO.match(t) for t in times), times
    code, _, err = _run(runner, "cancel", run_id, "--store", ledger)
    assert code == 2 and f"pipeline resume {run_id}" in err   # a failed run resumes


def test_cancel_of_a_succeeded_run_does_not_hint_resume(runner: CliRunner, write_flow,
                                                        ledger: str) -> None:
    flow = write_flow(FLOW)
    run_id = _run(runner, "run", f"{flow}:squares", "--store", ledger, "--executor",
                  "inline")[1].split()[1]
    code, _, err = _run(runner, "cancel", run_id, "--store", ledger)
    assert code == 2 and "already succeeded" in err
    assert "resume" not in err and f"pipeline status {run_id}" in err


def test_submit_on_a_duckdb_ledger_hints_resume_only(runner: CliRunner, write_flow,
                                                     ledger: str) -> None:
    flow = write_flow(FLOW)
    code, out, _ = _run(runner, "submit", f"{flow}:squares", "--store", ledger)
    assert code == 0
    run_id = out.split()[1]
    assert "worker" not in out and f"pipeline resume {run_id}" in out
    code, out, _ = _run(runner, "resume", run_id, "--store", ledger, "--executor", "inline")
    assert code == 0 and "result:  {'total': 5, 'n': 3}" in out


def test_a_worker_on_a_file_ledger_is_told_how_its_runs_are_driven(runner: CliRunner,
                                                                    ledger: str) -> None:
    code, _, err = _run(runner, "worker", "--store", ledger)
    assert code == 2
    assert "pipeline worker needs a PostgreSQL store" in err
    assert "pipeline resume RUN_ID --store PATH" in err


def test_runs_in_a_new_folder_says_where_it_looked(runner: CliRunner, tmp_path: Path) -> None:
    where = str(tmp_path / "nothing-here" / "ledger.duckdb")
    code, out, _ = _run(runner, "runs", "--store", where)
    assert code == 0 and out.strip() == f"no runs yet in {where}"


def test_debug_never_advises_running_with_debug(runner: CliRunner, write_flow) -> None:
    flow = write_flow(FLOW)
    def said(err: str) -> str:
        return "\n".join(line for line in err.splitlines()
                         if line.startswith(("Error:", "Hint:")))

    code, _, err = _run(runner, "graph", f"{flow}:body_fails")
    assert code == 2 and "run with --debug" in said(err)    # without it: the advice
    for args in (["--debug", "graph", f"{flow}:body_fails"],
                 ["graph", f"{flow}:body_fails", "--debug"]):
        code, _, err = _run(runner, *args)
        assert code == 2 and "Traceback" in err and "the body itself" in said(err)
        assert "--debug" not in said(err), said(err)
