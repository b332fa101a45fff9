"""Fixtures for the dask executor tests: the plugin, a shared cluster, a ledger path."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed")

PLUGINS = str(Path(__file__).resolve().parents[2] / "plugins")

try:    # until the package is reinstalled with the new entry point
    import ledgerflow_dask
except ImportError:
    sys.path.insert(0, PLUGINS)
    import ledgerflow_dask


@pytest.fixture(autouse=True)
def _dask_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make ``--executor dask`` resolvable here and importable in subprocesses."""
    from ledgerflow.plugins import get_plugin_manager

    path = os.environ.get("PYTHONPATH", "")
    if PLUGINS not in path.split(os.pathsep):
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (PLUGINS, path) if p))
    monkeypatch.delenv("LEDGERFLOW_DASK_ADDRESS", raising=False)
    pm = get_plugin_manager()
    if not pm.has_plugin("dask"):
        pm.register(ledgerflow_dask, name="dask")
    yield


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A fresh DuckDB ledger path."""
    return str(tmp_path / "ledger.duckdb")


@pytest.fixture(scope="module")
def shared_client() -> Iterator[Any]:
    """One LocalCluster for the quick tests (same settings as the executor's own)."""
    import logging

    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address="127.0.0.1:0",
                           scheduler_kwargs={"allowed_failures": 0},
                           silence_logs=logging.ERROR)
    client = Client(cluster, set_as_default=False)
    yield client
    client.close()
    cluster.close()
