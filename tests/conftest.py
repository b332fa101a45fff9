"""Shared fixtures: a ledger in a temp dir, and helpers to write pipeline files."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    """A DuckDB ledger path in a fresh temp dir."""
    return str(tmp_path / "ledger.duckdb")


@pytest.fixture
def write_flow(tmp_path: Path):
    """Write a pipeline module into tmp_path and return its path."""
    def write(source: str, name: str = "flow.py") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return str(path)
    return write


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for CLI subprocesses (no inherited ledger settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


PIPELINE_EXE = str(Path(sys.executable).parent / "pipeline")


# Folders and files whose tests need a server, a browser or an extra, marked here so that
# ``./dev test --quick`` can leave them out with one ``-m`` expression.
_MARK_BY_PATH = {
    "tests/postgres/": "postgres",
    "tests/dask/": "dask",
    "tests/console/test_console_browser.py": "browser",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix() \
            if Path(str(item.fspath)).resolve().is_relative_to(ROOT) else ""
        for prefix, mark in _MARK_BY_PATH.items():
            if rel.startswith(prefix):
                item.add_marker(getattr(pytest.mark, mark))
        if {"page", "browser"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.browser)        # any test that drives Chromium
