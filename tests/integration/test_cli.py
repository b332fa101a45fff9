"""CLI output, exit codes and Error/Hint lines (click's CliRunner, in process)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledgerflow.cli import main

FLOW = """
from ledgerflow import task, pipeline

@task
def square(x: int) -> int:
    return x * x

@task
def total(xs: list) -> int:
    return sum(xs)

@pipeline
def squares(n: int = 3, scale: float = 1.0, loud: bool = False):
    return total(square.map(list(range(n))))
"""


def _digest(path: str) -> str | None:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if os.path.exists(path) else None


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_run_status_runs_json(runner: CliRunner, write_flow, ledger: str) -> None:
    flow = write_flow(FLOW)
    res = runner.invoke(main, ["run", flow, "-p", "n=4", "--store", ledger, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc) >= {"run_id", "pipeline", "state", "tasks"}
    assert doc["state"] == "succeeded" and len(doc["tasks"]) == 5
    assert set(doc["tasks"][0]) >= {"key", "task", "state", "attempts", "started_at",
                                    "ended_at", "error"}
    res = runner.invoke(main, ["status", doc["run_id"], "--store", ledger, "--json"])
    assert json.loads(res.output)["run_id"] == doc["run_id"]
    res = runner.invoke(main, ["runs", "--store", ledger, "--json"])
    assert json.loads(res.output)[0]["run_id"] == doc["run_id"]
    res = runner.invoke(main, ["lineage", doc["run_id"], "--task", "total", "--store", ledger,
                               "--json"])
    rows = json.loads(res.output)
    assert any(r["uri"] == "task:square[0]" and r["direction"] == "input" for r in rows)
    res = runner.invoke(main, ["run", flow, "--store", ledger])
    assert res.exit_code == 0
    assert res.output.splitlines()[0].startswith("run ")
    res = runner.invoke(main, ["graph", flow, "--format", "mermaid"])
    assert res.exit_code == 0 and "flowchart TD" in res.output
    res = runner.invoke(main, ["plugins"])
    assert "executor:threads" in res.output and "store:duckdb" in res.output


BAD_INPUTS = {
    "missing file": (["run", "{tmp}/nope.py"], "pipeline file not found"),
    "syntax error": (["run", "{syntax}"], "syntax error in"),
    "import-time exception": (["run", "{boom}"], "ZeroDivisionError"),
    "unknown pipeline": (["run", "{flow}:nope"], "has no pipeline 'nope'"),
    "unknown parameter": (["run", "{flow}", "-p", "zz=1"], "has no parameter 'zz'"),
    "malformed parameter": (["run", "{flow}", "-p", "n"], "is not key=value"),
    "wrongly typed parameter": (["run", "{flow}", "-p", "n=three"], "must be int"),
    "wrong bool": (["run", "{flow}", "-p", "loud=maybe"], "must be bool"),
    "unknown executor": (["run", "{flow}", "--executor", "ray"], "executor 'ray' not found"),
    "unknown run id": (["status", "nope"], "no run 'nope'"),
    "resume unknown run": (["resume", "nope"], "no run 'nope'"),
    "cycle": (["run", "{cycle}"], "cycle in pipeline"),
    "workers zero": (["run", "{flow}", "--workers", "0"], "0"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_error_and_leaves_ledger_alone(
        case: str, runner: CliRunner, write_flow, ledger: str, tmp_path: Path) -> None:
    flow = write_flow(FLOW)
    runner.invoke(main, ["run", flow, "--store", ledger])       # a ledger to protect
    before = _digest(ledger)
    names = {
        "tmp": str(tmp_path), "flow": flow,
        "syntax": write_flow("def broken(:\n", "syntax.py"),
        "boom": write_flow("x = 1 / 0\n", "boom.py"),
        "cycle": str(_cycle_spec(tmp_path)),
    }
    args = [a.format(**names) for a in BAD_INPUTS[case][0]] + ["--store", ledger]
    res = runner.invoke(main, args)
    assert res.exit_code == 2, res.output
    assert BAD_INPUTS[case][1] in res.output
    assert "Traceback" not in res.output
    if case != "workers zero":
        assert res.output.startswith("Error: ") and "\nHint: " in res.output
    assert _digest(ledger) == before


def _cycle_spec(tmp: Path) -> Path:
    mod = tmp / "cycle_tasks.py"
    mod.write_text("from ledgerflow import task\n@task\ndef a():\n    return 1\n")
    spec = tmp / "cycle.json"
    spec.write_text(json.dumps({"tasks": {
        "x": {"task": "cycle_tasks:a", "after": ["y"]},
        "y": {"task": "cycle_tasks:a", "after": ["x"]}}}))
    return spec


def test_garbage_ledger_is_refused_and_unchanged(runner: CliRunner, write_flow,
                                                 tmp_path: Path) -> None:
    bad = tmp_path / "garbage.duckdb"
    bad.write_bytes(b"not a database" * 100)
    before = _digest(str(bad))
    res = runner.invoke(main, ["run", write_flow(FLOW), "--store", str(bad)])
    assert res.exit_code == 2 and "not a ledgerflow ledger" in res.output
    res = runner.invoke(main, ["runs", "--store", str(bad)])
    assert res.exit_code == 2
    assert _digest(str(bad)) == before


def test_newer_schema_is_refused_and_unchanged(runner: CliRunner, write_flow,
                                               ledger: str) -> None:
    import duckdb
    runner.invoke(main, ["run", write_flow(FLOW), "--store", ledger])
    con = duckdb.connect(ledger)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    before = _digest(ledger)
    res = runner.invoke(main, ["runs", "--store", ledger])
    assert res.exit_code == 2 and "schema version 99" in res.output and "Hint:" in res.output
    res = runner.invoke(main, ["run", write_flow(FLOW), "--store", ledger])
    assert res.exit_code == 2
    assert _digest(ledger) == before


def _undone(sql: str) -> str:
    """The statement that undoes one migration statement."""
    words = sql.split()
    if words[:3] == ["CREATE", "OR", "REPLACE"]:    # a view redefined: the migration
        return "SELECT 1"                           # that created it drops it
    if words[0] == "CREATE":            # CREATE TABLE|VIEW name(...)
        return f"DROP {words[1]} {words[2].split('(')[0]}"
    if words[3] == "RENAME":            # ALTER TABLE old RENAME TO new
        return f"ALTER TABLE {words[5]} RENAME TO {words[2]}"
    return f"ALTER TABLE {words[2]} DROP COLUMN {words[5]}"     # ... ADD COLUMN col TYPE


def test_a_ledger_of_an_older_release_is_upgraded_by_its_first_reader(
        runner: CliRunner, write_flow, ledger: str) -> None:
    import duckdb

    from ledgerflow_stores.duckdb.schema import MIGRATIONS, SCHEMA_VERSION
    res = runner.invoke(main, ["run", write_flow(FLOW), "--store", ledger, "--json"])
    run_id = json.loads(res.output)["run_id"]
    con = duckdb.connect(ledger)    # as a release at schema version 1 left it
    for _, statements in reversed(MIGRATIONS[1:]):
        for sql in reversed(statements):
            con.execute(_undone(sql))
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.close()
    for args in (["runs"], ["status", run_id], ["resume", run_id, "--plan"]):
        res = runner.invoke(main, [*args, "--store", ledger])
        assert res.exit_code == 0, res.output
        if args[0] == "status":
            assert "succeeded" in res.output
    con = duckdb.connect(ledger, read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() \
        == [(str(SCHEMA_VERSION),)]
    con.close()


def test_failed_run_exits_1_and_resume_plan(runner: CliRunner, write_flow, ledger: str) -> None:
    flow = write_flow("""
        from ledgerflow import task, pipeline
        @task
        def ok() -> int:
            return 1
        @task
        def bad(x: int) -> int:
            raise ValueError("broken")
        @pipeline
        def p():
            return bad(ok())
    """)
    res = runner.invoke(main, ["run", flow, "--store", ledger, "--json"])
    assert res.exit_code == 1
    run_id = json.loads(res.output)["run_id"]
    res = runner.invoke(main, ["resume", run_id, "--plan", "--store", ledger, "--json"])
    plan = {r["key"]: r["action"] for r in json.loads(res.output)}
    assert plan == {"ok": "reuse", "bad": "rerun"}


def test_options_come_from_the_environment(runner: CliRunner, write_flow, ledger: str) -> None:
    flow = write_flow(FLOW)
    env = {"LEDGERFLOW_STORE": ledger, "LEDGERFLOW_EXECUTOR": "inline",
           "LEDGERFLOW_WORKERS": "2", "LEDGERFLOW_JSON": "1"}
    res = runner.invoke(main, ["run", flow], env=env)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["state"] == "succeeded"
    res = runner.invoke(main, ["runs"], env={"LEDGERFLOW_STORE": ledger,
                                             "LEDGERFLOW_JSON": "1"})
    assert json.loads(res.output)[0]["run_id"] == doc["run_id"]
    res = runner.invoke(main, ["run", flow], env={**env, "LEDGERFLOW_EXECUTOR": "nope"})
    assert res.exit_code == 2 and "executor 'nope' not found" in res.output


@pytest.mark.parametrize("command", ["run", "resume", "cancel", "status", "runs", "lineage",
                                     "graph", "plugins"])
def test_every_command_has_help_with_an_example(runner: CliRunner, command: str) -> None:
    res = runner.invoke(main, [command, "--help"])
    assert res.exit_code == 0 and "Example:" in res.output


def test_runs_listing_carries_counts_and_parameters(write_flow, ledger: str) -> None:
    import ledgerflow
    flow = write_flow(FLOW)
    run = ledgerflow.run(flow, n=3, store=ledger, executor="inline")
    listed = ledgerflow.runs(store=ledger)[0]
    assert listed.run_id == run.run_id
    assert listed.counts() == {"succeeded": 4}
    assert json.loads(listed.params)["n"] == 3 and (listed.target or "").endswith("flow.py:squares")
    assert all(k for k in listed.tasks)     # no placeholder rows


def test_plugins_lists_embedders(runner: CliRunner) -> None:
    res = runner.invoke(main, ["plugins"])
    assert "embedder:hashing" in res.output and "executor:dask" in res.output


def test_status_table_shows_item_keys_and_groups_large_runs(runner: CliRunner, write_flow,
                                                            ledger: str) -> None:
    flow = write_flow(FLOW)
    small = runner.invoke(main, ["run", flow, "-p", "n=3", "--store", ledger, "--json"])
    run_id = json.loads(small.output)["run_id"]
    res = runner.invoke(main, ["status", run_id, "--store", ledger])
    assert "square[0]" in res.output and "square[2]" in res.output
    big = runner.invoke(main, ["run", flow, "-p", "n=80", "--store", ledger])
    assert big.exit_code == 0
    lines = [ln for ln in big.output.splitlines() if "square" in ln and "80 succeeded" in ln]
    assert lines, big.output


def test_lineage_export_goes_to_the_plugin_of_that_format(runner: CliRunner, write_flow,
                                                          ledger: str, tmp_path: Path) -> None:
    from ledgerflow import hookimpl
    from ledgerflow.plugins import get_plugin_manager
    from ledgerflow.store import RunStore

    class Exporter:
        @hookimpl
        def ledgerflow_lineage_formats(self) -> list[str]:
            return ["rows"]

        @hookimpl
        def ledgerflow_export_lineage(self, format: str, run_id: str, store: RunStore,
                                      path: str) -> int | None:
            if format != "rows":
                return None
            rows = store.lineage(run_id)
            Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
            return len(rows)

    res = runner.invoke(main, ["run", write_flow(FLOW), "--store", ledger, "--json"])
    run_id = json.loads(res.output)["run_id"]
    pm = get_plugin_manager()
    plugin = Exporter()
    pm.register(plugin, name="test-exporter")
    try:
        out = tmp_path / "rows.jsonl"
        res = runner.invoke(main, ["lineage", run_id, "--export", "rows", str(out),
                                   "--store", ledger])
        assert res.exit_code == 0, res.output
        lines = out.read_text().splitlines()
        assert res.output.strip() == f"wrote {len(lines)} rows item(s) of run {run_id} to {out}"
        assert any(json.loads(x)["uri"] == "task:square[0]" for x in lines)
        res = runner.invoke(main, ["lineage", run_id, "--export", "nope", str(out),
                                   "--store", ledger])
        assert res.exit_code == 2
        assert "no lineage export format 'nope'" in res.output and "rows" in res.output
        res = runner.invoke(main, ["lineage", "no-such-run", "--export", "rows",
                                   str(tmp_path / "x"), "--store", ledger])
        assert res.exit_code == 2 and not (tmp_path / "x").exists()
    finally:
        pm.unregister(plugin)
