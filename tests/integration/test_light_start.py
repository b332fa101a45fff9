"""A light CLI start: ``pipeline status`` and a small ``pipeline run`` import only
what they use (no agents, console, drafts, observability, index or Dask modules, and of
DuckDB only its engine: :mod:`ledgerflow_stores.duckdb.engine`), checked in real
subprocesses; the deferred plugins still answer when asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ledgerflow_stores.duckdb import engine

FLOW = """
from ledgerflow import task, pipeline

@task
def double(x: int) -> int:
    return 2 * x

@task
def add(a: int, b: int) -> int:
    return a + b

@pipeline
def small(n: int = 3):
    return add(double(n), double(n + 1))
"""

#: Top-level packages (or modules) a status or a small run must not import (``duckdb``:
#: DuckDB's Python API around the engine, ~40 ms the ledger does not use, where DuckDB
#: ships its engine as a module of its own).
HEAVY = ("ledgerflow_agents", "ledgerflow_console", "ledgerflow_drafts",
         "ledgerflow_observability", "ledgerflow_docindex", "ledgerflow_embed",
         "ledgerflow_dask", "ledgerflow_postgres", "ledgerflow.specs.drafts",
         *(("duckdb",) if engine.duckdb.__name__ == "_duckdb" else ()))

#: ... and what reading a run needs none of: the executors and the runner.
DRIVING = ("ledgerflow_executors", "ledgerflow.runner", "ledgerflow.executor",
           "ledgerflow.commits")

PROBE = """
import json, sys
from ledgerflow.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = HEAVY_NAMES
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.modules
                  if any(m == h or m.startswith(h + ".") for h in heavy))}))
"""


#: ... and, once the plugins' entry points are cached (:mod:`ledgerflow.entrypoints`),
#: the scan of every installed distribution's metadata.
SCAN = ("importlib.metadata",)


def _probe(args: list[str], env: dict[str, str],
           heavy: tuple[str, ...] = HEAVY, cwd: Path | None = None) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", PROBE.replace("HEAVY_NAMES", repr(heavy)),
                           *args], capture_output=True, text=True, env=env, timeout=300,
                          check=False, cwd=cwd)
    assert done.stderr == "" or "Traceback" not in done.stderr, done.stderr
    doc: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return doc


def test_status_and_a_small_run_import_no_plugin_they_do_not_use(
        write_flow, ledger: str, cli_env: dict[str, str], tmp_path: Path) -> None:
    flow = write_flow(FLOW)
    cli_env["XDG_CACHE_HOME"] = str(tmp_path / "cache")     # no entry points cached yet
    here = tmp_path / "here"        # the probes' folder (sys.path[0]): settled long ago
    here.mkdir()
    os.utime(here, (time.time() - 3600,) * 2)
    ran = _probe(["run", flow, "--executor", "inline", "--store", ledger, "--json"], cli_env,
                 cwd=here)
    assert ran == {"code": 0, "loaded": []}
    runs = subprocess.run([sys.executable, "-m", "ledgerflow", "runs", "--store", ledger,
                           "--json"], capture_output=True, text=True, env=cli_env,
                          timeout=300, check=True)
    run_id = json.loads(runs.stdout)[0]["run_id"]
    status = ["status", run_id, "--store", ledger]
    assert _probe(status, cli_env, HEAVY + DRIVING, cwd=here) == {"code": 0, "loaded": []}
    # (the run's key differs: its flow's folder, changed just now, is on its sys.path)
    assert _probe(status, cli_env, HEAVY + DRIVING + SCAN, cwd=here) == {"code": 0,
                                                                         "loaded": []}


def test_deferred_plugins_answer_when_asked(cli_env: dict[str, str]) -> None:
    listing = subprocess.run([sys.executable, "-m", "ledgerflow", "plugins"],
                             capture_output=True, text=True, env=cli_env, timeout=300,
                             check=True).stdout
    for offered in ("executor:dask", "store:postgres", "model:mock", "embedder:hashing"):
        assert offered in listing
    probe = ("from ledgerflow.plugins import get_plugin_manager\n"
             "import sys\n"
             "h = get_plugin_manager().hook\n"
             "names = sorted({n for ns in h.ledgerflow_executor_names() for n in ns})\n"
             "before = 'ledgerflow_dask' in sys.modules\n"
             "fmts = sorted({f for fs in h.ledgerflow_lineage_formats() for f in fs})\n"
             "from ledgerflow_agents import model_names\n"
             "print(names, before, fmts, model_names())\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=cli_env, timeout=300, check=True).stdout
    assert "'dask'" in out and " False " in out and "['openlineage']" in out
    assert "'mock'" in out
    help_text = subprocess.run([sys.executable, "-m", "ledgerflow", "--help"],
                               capture_output=True, text=True, env=cli_env, timeout=300,
                               check=True).stdout
    for command in ("search", "console", "draft", "worker", "status"):
        assert f"  {command} " in help_text
