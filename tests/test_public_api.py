"""The public surface: __all__ and strict typing (layering: test_layering.py)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

import ledgerflow

ROOT = Path(__file__).resolve().parents[1]
SDK = ROOT / "sdk" / "ledgerflow"


def test_all_is_sorted_and_complete() -> None:
    public = {n for n in vars(ledgerflow) if not n.startswith("_") and n != "annotations"}
    modules = {n for n in public if isinstance(getattr(ledgerflow, n), types.ModuleType)}
    assert ledgerflow.__all__ == sorted(ledgerflow.__all__)
    assert set(ledgerflow.__all__) - {"__version__"} == public - modules


@pytest.mark.slow
def test_strict_typing() -> None:
    res = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports",
                          "sdk/ledgerflow", "plugins/ledgerflow_executors",
                          "plugins/ledgerflow_stores", "plugins/ledgerflow_agents"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr


def test_program_is_exported_lazily() -> None:
    code = ("import sys, ledgerflow; assert 'ledgerflow.programs' not in sys.modules; "
            "t = ledgerflow.program('echo', ['echo', 'hi']); "
            "assert ledgerflow.Limits(cpu_s=1).cpu_s == 1; "
            "import ledgerflow.programs as m; from ledgerflow import program; "
            "from ledgerflow.programs import ProgramError; "
            "assert program is m.program and program('e', ['true']).name == 'e'; "
            "assert callable(ledgerflow.program) and ProgramError; print(t.name)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "echo", res.stderr
