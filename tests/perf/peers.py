"""Peers measured in the same run as ledgerflow: Hamilton, DBOS and raw Dask.

Each peer runs the workloads of :mod:`tests.perf.__main__` in its own idiom,
timed in-process, and is imported only when installed (the ``bench`` extra:
``pip install -e '.[bench]'`` or ``./dev bench``):

* **chain**: ``n`` steps, each taking the previous one's result;
* **fan-out**: ``n`` independent steps, each given one item.

Hamilton (``sf-hamilton``) persists nothing: the figure is ``Driver.execute``
of an already built driver (building costs ~50 µs a node more, reported
apart). DBOS is durable like the ledger (a SQLite system database, one
checkpoint per step): a workflow calling a step ``n`` times. Raw
``distributed``: ``client.submit`` of the same graph on the same cluster as
the ledgerflow ``dask`` executor (futures passed as arguments for a chain).
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any


def installed(name: str) -> bool:
    """True if the module ``name`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# -- Hamilton ---------------------------------------------------------------------------

_MODULES = itertools.count(1)


def _hamilton_module(shape: str, n: int) -> tuple[types.ModuleType, list[str]]:
    """A module of ``n`` Hamilton functions (the graph is the functions' parameter names)."""
    from hamilton import ad_hoc_utils

    fns = []
    if shape == "chain":
        def first() -> int:
            return 0
        fns.append(_named(first, "n0"))
        for i in range(1, n):
            fns.append(_named(_link(f"n{i - 1}"), f"n{i}"))
        outputs = [f"n{n - 1}"]
    else:
        for i in range(n):
            fns.append(_named(_const(i), f"n{i}"))
        outputs = [f"n{i}" for i in range(n)]
    # a new name each time: Hamilton refuses a module name it has seen (repeated runs)
    name = f"lf_peer_{shape.replace('-', '_')}_{n}_{next(_MODULES)}"
    return ad_hoc_utils.create_temporary_module(*fns, module_name=name), outputs


def _named(fn: Any, name: str) -> Any:
    fn.__name__ = fn.__qualname__ = name
    return fn


def _link(upstream: str) -> Any:
    ns: dict[str, Any] = {}
    exec(f"def f({upstream}: int) -> int:\n    return {upstream}\n", ns)
    return ns["f"]


def _const(i: int) -> Any:
    def f() -> int:
        return i
    return f


def hamilton(shape: str, n: int) -> tuple[float, float]:
    """(execute µs a task, driver build µs a task) for one Hamilton run."""
    from hamilton import driver

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 4 * n + 1000))   # Hamilton recurses along a chain
    try:
        module, outputs = _hamilton_module(shape, n)
        t = time.perf_counter()
        dr = driver.Builder().with_modules(module).build()
        build = time.perf_counter() - t
        t = time.perf_counter()
        out = dr.execute(outputs)
        dt = time.perf_counter() - t
        assert len(out) == len(outputs)
        return dt / n * 1e6, build / n * 1e6
    finally:
        sys.setrecursionlimit(old)


# -- DBOS -------------------------------------------------------------------------------

class _Dbos:
    """One DBOS instance with a SQLite system database in a temporary folder."""

    def __init__(self) -> None:
        from dbos import DBOS

        logging.getLogger("dbos").setLevel(logging.WARNING)
        self.folder = tempfile.mkdtemp(prefix="lf-perf-dbos-")
        DBOS(config={"name": "lf-perf", "log_level": "WARNING",
                     "system_database_url": f"sqlite:///{Path(self.folder) / 'dbos.sqlite'}"})

        @DBOS.step()
        def noop(x: int) -> int:
            return x

        @DBOS.workflow()
        def chain(n: int) -> int:
            x = noop(0)
            for _ in range(n - 1):
                x = noop(x)
            return x

        @DBOS.workflow()
        def fanout(n: int) -> list[int]:
            return [noop(i) for i in range(n)]

        self.flows = {"chain": chain, "fan-out": fanout}
        DBOS.launch()
        self.flows["chain"](5)      # warm-up: connections, tables

    def run(self, shape: str, n: int) -> float:
        t = time.perf_counter()
        self.flows[shape](n)
        return (time.perf_counter() - t) / n * 1e6

    def close(self) -> None:
        import shutil

        from dbos import DBOS

        DBOS.destroy(destroy_registry=True)
        shutil.rmtree(self.folder, ignore_errors=True)


def dbos(shapes: list[tuple[str, int]]) -> dict[tuple[str, int], float]:
    """µs a task of each (shape, n), on one DBOS instance."""
    d = _Dbos()
    try:
        return {(shape, n): d.run(shape, n) for shape, n in shapes}
    finally:
        d.close()


# -- raw distributed, and the ledgerflow dask executor on the same cluster -------------

def _ident(x: int) -> int:
    return x


def raw_distributed(client: Any, shape: str, n: int) -> float:
    """µs a task of ``client.submit`` of the workload's graph, all futures gathered."""
    t = time.perf_counter()
    if shape == "chain":
        fut = client.submit(_ident, 0, pure=False)
        for _ in range(n - 1):
            fut = client.submit(_ident, fut, pure=False)
        client.gather(fut)
    else:
        futs = [client.submit(_ident, i, pure=False) for i in range(n)]
        client.gather(futs)
    return (time.perf_counter() - t) / n * 1e6


def dask_cluster(workers: int = 2) -> tuple[Any, Any]:
    """A LocalCluster of ``workers`` one-thread worker processes, and its client."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address="127.0.0.1:0",
                           silence_logs=logging.ERROR)
    return cluster, Client(cluster, set_as_default=False)


def ledgerflow_dask(client: Any, pipe: Any, n: int, store: str, salt: int) -> float:
    """µs a task of ``pipe`` on the ledgerflow ``dask`` executor (DuckDB ledger)."""
    from ledgerflow_dask import DaskExecutor

    t = time.perf_counter()
    run = pipe.run(n=n, salt=salt, store=store,
                   executor=DaskExecutor(client=client, direct=True), workers=2)
    dt = time.perf_counter() - t
    assert run.state == "succeeded", run.state
    return dt / n * 1e6


def machine() -> dict[str, Any]:
    """CPU model and core count (from /proc/cpuinfo where there is one)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": model or "unknown", "cores": os.cpu_count(), "load_1min": load}
