"""The README's examples, run as written and in the order written (real subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .cli import run as _run
from .cli import run_id as _run_id
from .readme import blocks, commands

pytestmark = pytest.mark.subprocess


def test_ten_lines(tmp_path: Path) -> None:
    (python,) = blocks("Ten lines", "python")
    (shell,) = blocks("Ten lines", "bash")
    run_cmd, status_cmd, resume_cmd = commands(shell)
    assert run_cmd[2] == "flows.py"
    (tmp_path / "flows.py").write_text(python)

    ran = _run(run_cmd, tmp_path)
    assert ran.returncode == 0, ran.stderr
    run_id = _run_id(ran.stdout.splitlines()[0])          # the run id comes first

    status = _run(status_cmd, tmp_path, RUN_ID=run_id)
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    assert view["state"] == "succeeded"
    assert sorted(t["key"] for t in view["tasks"]) == sorted(
        ["fetch"] + [f"square[{i}]" for i in range(5)])

    # the run succeeded, so resume refuses with a cause and a hint, changing nothing
    resumed = _run(resume_cmd, tmp_path, RUN_ID=run_id)
    assert resumed.returncode == 2, resumed.stdout + resumed.stderr
    assert "Traceback" not in resumed.stderr and "succeeded" in resumed.stderr
    again = _run(status_cmd, tmp_path, RUN_ID=run_id)
    assert json.loads(again.stdout)["state"] == "succeeded"

