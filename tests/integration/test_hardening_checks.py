"""Issue 31 hardening checks, in real processes: what a user running ``pipeline`` sees.

* A policy's path glob holds where the file really is: ``out/*.txt`` does not let a
  step write through a symlink under ``out/`` to a folder outside it (a glob matched
  the path as spelled, and ``*`` crosses ``/``).
* A sandboxed program killed by a signal fails its task with the signal's name in
  ``pipeline status`` (bubblewrap reported ``exited with code 137``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]


def pipeline(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


SPEC = '''
[tasks.load]
task = "steps.py:load"
args = {{ rows = 3 }}

[tasks.total]
task = "steps.py:total"
inputs = {{ values = "load" }}

[tasks.save]
task = "steps.py:save"
inputs = {{ value = "total" }}
args = {{ path = "{path}" }}
'''


def test_a_path_glob_of_the_policy_holds_through_a_symlink(tmp_path: Path) -> None:
    project, outside = tmp_path / "project", tmp_path / "outside"
    (project / "out").mkdir(parents=True)
    outside.mkdir()
    shutil.copy(ROOT / "docs" / "drafts-example" / "steps.py", project / "steps.py")
    (project / "out" / "sub").symlink_to(outside)
    (project / "P.toml").write_text('[paths]\nwrite = ["out/*.txt"]\n')
    (project / "ok.toml").write_text(SPEC.format(path="out/total.txt"))
    (project / "escape.toml").write_text(SPEC.format(path="out/sub/total.txt"))
    assert pipeline(project, "validate", "ok.toml", "--policy", "P.toml").returncode == 0
    done = pipeline(project, "validate", "escape.toml", "--policy", "P.toml")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "tasks.save.args.path" in done.stdout + done.stderr
    done = pipeline(project, "run", "escape.toml", "--policy", "P.toml",
                    "--store", "ledger.duckdb")
    assert done.returncode == 2, done.stdout + done.stderr
    assert not (outside / "total.txt").exists() and not (project / "ledger.duckdb").exists()


PROGRAM = '''
from ledgerflow import pipeline, program

killed = program("killed", ["sh", "-c", "kill -KILL $$"], sandbox="bwrap")


@pipeline
def boxed():
    return killed()
'''


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_sandboxed_program_killed_by_a_signal_says_so_in_status(tmp_path: Path) -> None:
    (tmp_path / "boxed.py").write_text(PROGRAM)
    done = pipeline(tmp_path, "run", "boxed.py:boxed", "--store", "ledger.duckdb")
    assert done.returncode == 1, done.stdout + done.stderr
    runs = json.loads(pipeline(tmp_path, "runs", "--json", "--store", "ledger.duckdb").stdout)
    rid = (runs[0] if isinstance(runs, list) else runs["runs"][0])["run_id"]
    status = json.loads(pipeline(tmp_path, "status", rid, "--json",
                                 "--store", "ledger.duckdb").stdout)
    (task,) = status["tasks"]
    assert task["state"] == "failed" and "killed by SIGKILL" in task["error"], task
    assert "exited with code" not in task["error"]
