"""An unapproved draft is read as data: nothing it names is imported, in real processes.

A draft whose steps name a module that writes a marker file when imported (by
absolute path, and an importable module on the path) is validated with
``--plan``, approved and run, each in its own ``pipeline`` process: every
command refuses with exit 2 and a one-line cause, and no marker appears.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from ledgerflow.specs import drafts

from .conftest import GOOD, turn

pytestmark = pytest.mark.subprocess

SIDE_EFFECT = '''
from pathlib import Path
Path({marker!r}).write_text("imported")
from ledgerflow import task

@task
def {name}(rows: int = 1) -> int:
    return rows
'''


def pipeline(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=180)


def test_an_unapproved_draft_imports_nothing_it_names(project: Path,
                                                       cli: Callable[..., Result]) -> None:
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    by_path, by_name = project / "marker-by-path", project / "marker-by-name"
    (elsewhere / "by_path.py").write_text(SIDE_EFFECT.format(marker=str(by_path), name="x"))
    (project / "by_name.py").write_text(SIDE_EFFECT.format(marker=str(by_name), name="y"))
    spec = json.loads(json.dumps(GOOD))
    spec["tasks"]["a"] = {"task": f"{elsewhere / 'by_path.py'}:x", "args": {"rows": 2}}
    spec["tasks"]["b"] = {"task": "by_name:y", "after": ["a"]}
    res = cli("draft", "sum the numbers", "--tasks", "steps.py", "-o", "draft.toml",
              "--repairs", "0", "--model", "mock", turns=[turn(spec)])
    assert res.exit_code == 2, res.output      # written, with its problems
    text = (project / "draft.toml").read_text()
    header = drafts.parse_header(text, None)
    assert header is not None and header.tasks == (str(project / "steps.py"),)
    digest = drafts.spec_digest(json.loads(json.dumps(spec)))
    ledger = str(project / "ledger.duckdb")
    for args in (["validate", "draft.toml", "--plan"],
                 ["approve-draft", "draft.toml", "--digest", digest[:12], "--store", ledger],
                 ["run", "draft.toml", "--store", ledger, "--executor", "inline"]):
        done = pipeline(project, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        assert "not one of the tasks this draft may use" in done.stdout + done.stderr
        assert not by_path.exists() and not by_name.exists(), args
    # the catalogue's own tasks were checked all the same (the plan lists them)
    done = pipeline(project, "validate", "draft.toml", "--plan", "--json")
    doc = json.loads(done.stdout)
    assert {(p["path"], p["code"]) for p in doc["problems"]} == {
        ("tasks.a.task", "task.unknown"), ("tasks.b.task", "task.unknown")}
    assert [r["task"] for r in doc["plan"]] == ["steps.py:load", "steps.py:double",
                                                "steps.py:total", "steps.py:save"]
    assert not by_path.exists() and not by_name.exists()
    # once the header is gone it is a hand-written spec: then the modules are imported
    (project / "mine.toml").write_text(text.split("\n\n", 1)[1])
    done = pipeline(project, "validate", "mine.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert by_path.exists() and by_name.exists()


def test_a_draft_without_its_catalogue_is_not_checked_by_importing(
        project: Path, cli: Callable[..., Result]) -> None:
    """A header with no draft-tasks line (an older draft): refused, nothing imported."""
    marker = project / "marker"
    (project / "by_name.py").write_text(SIDE_EFFECT.format(marker=str(marker), name="y"))
    assert cli("draft", "sum", "--tasks", "steps.py", "-o", "draft.toml", "--repairs", "0",
               "--model", "mock", turns=[turn(GOOD)]).exit_code == 0
    text = (project / "draft.toml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("# draft-tasks:")]
    body = "\n".join(lines).replace('"steps.py:load"', '"by_name:y"') + "\n"
    (project / "draft.toml").write_text(body)
    done = pipeline(project, "validate", "draft.toml", "--json")
    assert done.returncode == 2
    codes = {p["code"] for p in json.loads(done.stdout)["problems"]}
    assert "draft.no_catalogue" in codes and "task.unknown" in codes
    assert not marker.exists()
