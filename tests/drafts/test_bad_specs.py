"""Bad spec files exit 2 with a one-line cause, in real processes: never 70 and a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess


def pipeline(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def _nested(depth: int, toml: bool) -> bytes:
    value = "[" * depth + "]" * depth
    if toml:
        return f'[tasks.a]\ntask = "steps.py:one"\nargs = {{ x = {value} }}\n'.encode()
    return ('{"tasks": {"a": {"task": "steps.py:one", "args": {"x": ' + value + "}}}}").encode()


CASES = {
    "not UTF-8 (JSON)": ("s.json", b'{"tasks": {"a": {"task": "steps.py:one", "args": '
                                   b'{"x": "\xff\xfe"}}}}', "is not valid UTF-8 text"),
    "not UTF-8 (TOML)": ("s.toml", b'[tasks.a]\ntask = "steps.py:one"\nargs = { x = "\xc3" }\n',
                         "is not valid UTF-8 text"),
    "nested past the parser (JSON)": ("s.json", _nested(100_000, False), "nest too deeply"),
    "nested past the parser (TOML)": ("s.toml", _nested(100_000, True), "nest too deeply"),
    "nested past the limit (JSON)": ("s.json", _nested(150, False), "more than 100 levels"),
    "nested past the limit (TOML)": ("s.toml", _nested(900, True), "nest"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_spec_file_exits_2_with_its_cause(case: str, tmp_path: Path) -> None:
    name, content, cause = CASES[case]
    (tmp_path / "steps.py").write_text("from ledgerflow import task\n\n@task\n"
                                       "def one(x: object = None) -> int:\n    return 1\n")
    (tmp_path / name).write_bytes(content)
    for args in (["validate", name], ["run", name, "--store", "ledger.duckdb"],
                 ["graph", name]):
        done = pipeline(tmp_path, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stdout + done.stderr
        text = done.stdout + done.stderr
        assert f"spec {name} is not valid" in text and cause in text, (args, text)
        if args[0] != "validate":           # validate lists it as the file's one problem
            errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
            assert len(errors) == 1 and cause in errors[0], done.stderr
    assert not (tmp_path / "ledger.duckdb").exists()


def test_a_policy_that_is_not_utf8_exits_2(tmp_path: Path) -> None:
    (tmp_path / "P.toml").write_bytes(b'models = ["\xff"]\n')
    (tmp_path / "s.json").write_text('{"tasks": {"a": {"task": "nowhere:x"}}}')
    done = pipeline(tmp_path, "validate", "s.json", "--policy", "P.toml")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "policy P.toml is not valid UTF-8 text" in done.stderr
