"""The public surface: __all__, import layering, and strict typing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import ledgerflow

ROOT = Path(__file__).resolve().parents[1]
SDK = ROOT / "sdk" / "ledgerflow"


def test_all_is_sorted_and_complete() -> None:
    public = {n for n in vars(ledgerflow) if not n.startswith("_") and n != "annotations"}
    modules = {n for n in public if type(getattr(ledgerflow, n)).__name__ == "module"}
    assert ledgerflow.__all__ == sorted(ledgerflow.__all__)
    assert set(ledgerflow.__all__) - {"__version__"} == public - modules


KERNEL = ("task", "graph", "states", "scheduler", "keys", "results", "context", "errors")
FORBIDDEN = ("runner", "run", "cli", "plugins", "ledgerflow_executors", "ledgerflow_stores")


@pytest.mark.parametrize("module", KERNEL)
def test_kernel_modules_do_not_import_the_driver_or_plugins(module: str) -> None:
    tree = ast.parse((SDK / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            name = (node.module or "").lstrip(".")
            assert name.split(".")[0] not in FORBIDDEN, f"{module} imports {name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] not in FORBIDDEN


@pytest.mark.slow
def test_strict_typing() -> None:
    res = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports",
                          "sdk/ledgerflow", "plugins/ledgerflow_executors",
                          "plugins/ledgerflow_stores", "plugins/ledgerflow_agents"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
