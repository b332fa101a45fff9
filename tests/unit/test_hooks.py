"""Observer hooks hear of a transition only once it is durable."""

from __future__ import annotations

from pathlib import Path

import ledgerflow
from ledgerflow import hookimpl, pipeline, task
from ledgerflow.plugins import get_plugin_manager
from ledgerflow_stores.duckdb import DuckDBStore


@task
def one(i: int) -> int:
    return i


@pipeline
def chain(n: int = 5):
    x = one(0)
    for _ in range(1, n):
        x = one(x)
    return x


def test_task_hook_fires_after_the_commit_that_holds_the_transition(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.duckdb")
    seen: list[tuple[str, str, str]] = []

    class Observer:
        @hookimpl
        def ledgerflow_task_state_changed(self, run_id: str, task_key: str, new: str) -> None:
            # another reader (a fresh store object reads journal + file) sees it already
            row = DuckDBStore(path).get_run(run_id).tasks[task_key]
            seen.append((task_key, new, row.state))

    pm = get_plugin_manager()
    plugin = Observer()
    pm.register(plugin, name="test-observer")
    try:
        run = chain.run(store=path, executor="inline")
    finally:
        pm.unregister(plugin)
    assert run.state == "succeeded"
    assert len(seen) == 5 * 4          # pending, ready, running, succeeded per task
    for key, new, durable in seen:
        # the durable state is this one or a later one of the same commit
        order = ["pending", "ready", "running", "succeeded"]
        assert order.index(durable) >= order.index(new), (key, new, durable)


def test_the_pipeline_body_is_traced_once_per_cli_run(tmp_path: Path, write_flow) -> None:
    import subprocess
    import sys
    log = tmp_path / "traced.log"
    flow = write_flow(f"""
        from ledgerflow import task, pipeline

        @task
        def one() -> int:
            return 1

        @pipeline
        def p():
            with open({str(log)!r}, "a") as fh:
                fh.write("traced\\n")
            return one()
        """)
    res = subprocess.run([sys.executable, "-m", "ledgerflow", "run", flow, "--store",
                          str(tmp_path / "l.duckdb")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert log.read_text().splitlines() == ["traced"]
    assert ledgerflow.runs(store=str(tmp_path / "l.duckdb"))[0].state == "succeeded"
