"""Shared pieces of the drafts tests: a catalogue of tasks, a policy, a mock model script."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ledgerflow.cli import main

ROOT = Path(__file__).resolve().parents[2]
#: The catalogue the drafts use: the docs' example (docs/drafts-example/steps.py: plain
#: tasks, one that writes a file (declared), an "agent" that declares a shell tool and the
#: network, one behind an approval gate), plus a model step and a program.
STEPS = (ROOT / "docs" / "drafts-example" / "steps.py").read_text() + '''

from ledgerflow import program


@needs(models=["{model}"], keys=["{key}"], budget_usd="{budget}")
@task
def summarize(text: str, model: str = "local", key: str = "", budget: float = 0.1) -> str:
    """An agent step: a model, a key alias and a budget, from its arguments."""
    return text[:10]


echo = program("echo", ["echo", "{text}"])
'''


POLICY = '''
network = false
tools = ["search_index"]
models = ["mock"]

[tasks]
allow = ["steps.py:*"]

[paths]
write = ["out/"]
'''

#: A valid draft over STEPS: 1..10 doubled, summed, the total saved to out/total.txt.
GOOD: dict[str, Any] = {"name": "sum", "tasks": {
    "load": {"task": "steps.py:load", "args": {"rows": 10}},
    "double": {"task": "steps.py:double", "map": "load"},
    "total": {"task": "steps.py:total", "inputs": {"values": "double"}},
    "save": {"task": "steps.py:save", "inputs": {"value": "total"},
             "args": {"path": "out/total.txt"}}}}


def turn(spec: dict[str, Any]) -> dict[str, Any]:
    """A mock model turn that calls write_spec with ``spec``."""
    return {"tool_calls": [{"name": "write_spec", "arguments": spec}],
            "usage": {"input_tokens": 500, "output_tokens": 80}}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the catalogue (steps.py) and a policy; the working directory."""
    (tmp_path / "steps.py").write_text(textwrap.dedent(STEPS))
    (tmp_path / "POLICY.toml").write_text(POLICY)
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LEDGERFLOW_STORE", raising=False)
    monkeypatch.delenv("LEDGERFLOW_POLICY", raising=False)
    return tmp_path


@pytest.fixture
def cli(project: Path) -> Callable[..., Result]:
    """Run ``pipeline ARGS`` in process with the project's ledger (``turns``: the mock's
    script for this call)."""
    runner = CliRunner()
    ledger = str(project / "ledger.duckdb")

    def invoke(*args: str, turns: list[dict[str, Any]] | None = None,
               store: bool = True) -> Result:
        env = {}
        if turns is not None:
            script = project / f"script-{len(list(project.glob('script-*')))}.json"
            script.write_text(json.dumps({"turns": turns}))
            env["LEDGERFLOW_MOCK_MODEL"] = str(script)
        argv = list(args)
        if store:
            argv += ["--store", ledger]
        return runner.invoke(main, argv, env=env, catch_exceptions=False)
    return invoke
