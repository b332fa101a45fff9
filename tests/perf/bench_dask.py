"""Benchmark the ``dask`` executor against ``threads``; prints a table, writes JSON.

Run from the repository root (not collected by pytest: no ``test_`` prefix)::

    .venv/bin/python tests/perf/bench_dask.py [--sizes 1000 10000] [--out bench_dask.json]

Measures (1) overhead per trivial task of a ``.map`` fan-out, run end to end
through the runner and a DuckDB ledger, for ``threads`` and for ``dask``
(cluster started beforehand, its start time reported separately; runner
in-flight limit 2 and 8), and (2) the speed-up of a CPU-bound fan-out
(SHA-256 rounds) on a 2-worker LocalCluster over a 1-worker one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ledgerflow import pipeline, task

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins"))


@task(cache=False)
def noop(x: int) -> int:
    return x


@pipeline
def trivial(n: int = 1000):
    return noop.map(list(range(n)))


@task(cache=False)
def churn(i: int, rounds: int) -> str:
    h = hashlib.sha256(str(i).encode())
    for _ in range(rounds):
        h = hashlib.sha256(h.digest())
    return h.hexdigest()


@pipeline
def cpu_fan(n: int = 16, rounds: int = 400_000):
    return churn.map(list(range(n)), rounds=rounds)


def timed_run(pipe: Any, folder: str, executor: Any, workers: int, **params: Any) -> float:
    """Seconds for one run into a fresh ledger."""
    store = os.path.join(folder, f"ledger-{time.monotonic_ns()}.duckdb")
    t0 = time.perf_counter()
    run = pipe.run(store=store, executor=executor, workers=workers, **params)
    elapsed = time.perf_counter() - t0
    assert run.state == "succeeded", run.state
    return elapsed


def local_cluster(n: int) -> tuple[Any, Any, float]:
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address="127.0.0.1:0",
                           scheduler_kwargs={"allowed_failures": 0},
                           silence_logs=logging.ERROR)
    client = Client(cluster, set_as_default=False)
    return cluster, client, time.perf_counter() - t0


def main() -> None:
    from ledgerflow_dask import DaskExecutor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--cpu-tasks", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=400_000)
    ap.add_argument("--out", default="bench_dask.json")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        cluster, client, start_s = local_cluster(2)
        try:
            for n in args.sizes:
                secs = timed_run(trivial, folder, "threads", 2, n=n)
                rows.append({"bench": "overhead", "executor": "threads", "inflight": 2,
                             "tasks": n, "seconds": secs, "us_per_task": secs / n * 1e6})
                for inflight in (2, 8):
                    ex = DaskExecutor(client=client, direct=True)
                    secs = timed_run(trivial, folder, ex, inflight, n=n)
                    rows.append({"bench": "overhead", "executor": "dask",
                                 "inflight": inflight, "tasks": n, "seconds": secs,
                                 "us_per_task": secs / n * 1e6})
        finally:
            client.close()
            cluster.close()
        cpu: dict[int, float] = {}
        for workers in (1, 2):
            cluster, client, _ = local_cluster(workers)
            try:
                ex = DaskExecutor(client=client, direct=True)
                cpu[workers] = timed_run(cpu_fan, folder, ex, workers, n=args.cpu_tasks,
                                         rounds=args.rounds)
            finally:
                client.close()
                cluster.close()
            rows.append({"bench": "cpu_fan_out", "executor": "dask", "inflight": workers,
                         "dask_workers": workers, "tasks": args.cpu_tasks,
                         "seconds": cpu[workers]})
    speedup = cpu[1] / cpu[2]
    report = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
              "local_cluster_start_s": start_s, "cpu_speedup_2_vs_1": speedup, "rows": rows}
    print(f"LocalCluster(2) start: {start_s:.2f} s")
    print(f"{'bench':<12} {'executor':<8} {'inflight':>8} {'tasks':>7} {'seconds':>8} "
          f"{'us/task':>9}")
    for r in rows:
        per = f"{r['us_per_task']:9.0f}" if "us_per_task" in r else f"{'':>9}"
        print(f"{r['bench']:<12} {r['executor']:<8} {r['inflight']:>8} {r['tasks']:>7} "
              f"{r['seconds']:8.2f} {per}")
    print(f"CPU-bound fan-out speed-up, 2 workers vs 1: {speedup:.2f}x")
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
