"""Benchmark: per-task overhead of the postgres store, beside DuckDB, in the same run.

10,000 trivial tasks (a fan-out and a chain), inline and threads executors (4 workers,
and 16 for the fan-out: a group commit holds at most about as many finished tasks as
run at once, since a task starts only after the commit of its ``running``), on

* ``postgres``: a PostgreSQL 15 server this script starts (tests/postgres/pgserver.py:
  127.0.0.1, a free port, default durability: ``synchronous_commit = on``),
* ``postgres async``: the same with ``synchronous_commit=off`` in the URL's options
  (commits are acknowledged before the WAL is flushed: a *server* crash may lose the
  last ~0.6 s of commits; shown to separate the round trips from the fsync),
* ``duckdb``: the default store, a file in a temp dir,
* ``memory``: no persistence, the floor.

    python tests/perf/bench_postgres.py                 # 10,000 tasks
    python tests/perf/bench_postgres.py --tasks 2000 --out perf-postgres.json

Prints one table (µs per task: wall time of ``pipeline.run`` / tasks) and writes JSON.
Target: under 100 µs a task. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ledgerflow import pipeline, task  # noqa: E402
from tests.postgres.pgserver import PgServer, missing_reason  # noqa: E402


@task
def noop(x: int = 0) -> int:
    return x


@pipeline
def chain(n: int):
    x = noop(0)
    for _ in range(n - 1):
        x = noop(x)
    return x


@pipeline
def fanout(n: int):
    return noop.map(list(range(n)))


def per_task_us(pipe: Any, n: int, store: str, executor: str, workers: int = 4) -> float:
    pipe.run(n=50, store=store, executor=executor, workers=workers)   # warm: tables, caches
    t = time.perf_counter()
    run = pipe.run(n=n, store=store, executor=executor, workers=workers)
    dt = time.perf_counter() - t
    assert run.state == "succeeded", run.state
    return dt / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--out", default="perf-postgres.json")
    args = ap.parse_args()
    reason = missing_reason()
    if reason:
        sys.exit(f"cannot benchmark the postgres store: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="lf-bench-pg-"))
    os.environ["LEDGERFLOW_BLOB_DIR"] = str(tmp / "blobs")
    server = PgServer()
    server.start()
    rows: list[dict[str, Any]] = []
    try:
        stores = {
            "memory": lambda shape, ex: f"memory:{shape}-{ex}",
            "duckdb": lambda shape, ex: str(tmp / f"{shape}-{ex}.duckdb"),
            "postgres": lambda shape, ex: server.create_schema(f"b_{shape}_{ex}"),
            "postgres async": lambda shape, ex: server.create_schema(
                f"a_{shape}_{ex}") + "%20-csynchronous_commit%3Doff",
        }
        n = args.tasks
        print(f"{'shape':<8} {'executor':<12} {'store':<15} {'us/task':>9}  target", flush=True)
        plan = [("fan-out", fanout, "inline", 1), ("fan-out", fanout, "threads", 4),
                ("fan-out", fanout, "threads", 16), ("chain", chain, "inline", 1),
                ("chain", chain, "threads", 4)]
        for shape, pipe, ex, workers in plan:
            label = ex if ex == "inline" else f"{ex} x{workers}"
            for name, where in stores.items():
                us = per_task_us(pipe, n, where(f"{shape.replace('-', '')}{workers}", ex),
                                 ex, workers)
                target = "< 100" if name == "postgres" else "-"
                rows.append({"shape": shape, "executor": ex, "workers": workers,
                             "store": name, "tasks": n, "us_per_task": round(us, 1),
                             "target": target})
                print(f"{shape:<8} {label:<12} {name:<15} {us:>9.1f}  {target}", flush=True)
    finally:
        server.destroy()
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "platform": platform.platform(), "load": os.getloadavg()},
           "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
