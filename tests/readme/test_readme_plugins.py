"""The README's minimal executor plugin (``my_exec.py``) registered as its comment says, through
an entry point ``mine = "my_exec"`` of the group ``ledgerflow`` (a distribution's metadata on
the path, as an install of ``[project.entry-points.ledgerflow]`` writes it), then listed by
``pipeline plugins`` and used by the Ten lines pipeline with ``--executor serial``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from . import cli
from .readme import blocks, commands

pytestmark = pytest.mark.subprocess


def test_the_minimal_executor_plugin_runs_the_ten_lines(tmp_path: Path) -> None:
    (plugin,) = blocks("Plugins", "python")
    assert plugin.startswith("# my_exec.py") and 'mine = "my_exec"' in plugin.splitlines()[0]
    site = tmp_path / "site"
    (site / "my_exec-0.1.dist-info").mkdir(parents=True)
    (site / "my_exec.py").write_text(plugin)
    (site / "my_exec-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: my-exec\nVersion: 0.1\n")
    (site / "my_exec-0.1.dist-info" / "entry_points.txt").write_text(
        "[ledgerflow]\nmine = my_exec\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    extra = {"PYTHONPATH": path}

    listed = cli.run(["pipeline", "plugins"], tmp_path, extra=extra)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "mine" in listed.stdout and "serial" in listed.stdout, listed.stdout

    (tmp_path / "flows.py").write_text(blocks("Ten lines", "python")[0])
    run_cmd = commands(blocks("Ten lines", "bash")[0])[0]
    ran = cli.run([*run_cmd, "--executor", "serial"], tmp_path, extra=extra)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = cli.run_id(ran.stdout.splitlines()[0])
    status = cli.run(["pipeline", "status", run_id, "--json"], tmp_path)
    view = json.loads(status.stdout)
    assert view["state"] == "succeeded" and len(view["tasks"]) == 6

    import ledgerflow

    run = ledgerflow.get_run(run_id, store=str(tmp_path / ".ledgerflow" / "ledger.duckdb"))
    assert run.result() == [0, 1, 4, 9, 16]
