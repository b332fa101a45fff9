"""Benchmark the ``dask`` executor against ``threads``; prints a table, writes JSON.

Run from the repository root (not collected by pytest: no ``test_`` prefix)::

    .venv/bin/python tests/perf/bench_dask.py [--sizes 1000 10000] [--out bench_dask.json]

With ``--ratio N`` it measures instead what issue 29 sets a bar for: an
``N``-task fan-out through the executor (DuckDB ledger, runner ``workers=2``)
against raw ``client.submit`` of the same plain function on the same
2-worker cluster, interleaved ``--reps`` times, and prints each ratio, the
median and the load average (``--old DIR`` adds a copy of an earlier
``ledgerflow_dask_old`` package from ``DIR``, run interleaved with the others)::

    .venv/bin/python tests/perf/bench_dask.py --ratio 1000 --reps 3

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
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


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


def plain_ident(x: int, salt: int = 0) -> int:
    """What both sides run: raw Dask by reference, the executor as the task ``ident``."""
    return x


ident = task(cache=False, name="ident")(plain_ident)


@pipeline
def salted_fan(n: int = 1000, salt: int = 0):
    return ident.map(list(range(n)), salt=salt)


def raw_submit(client: Any, n: int, salt: int) -> float:
    """Seconds for ``n`` raw ``client.submit`` calls of ``ident``'s function, gathered."""
    from tests.perf.bench_dask import plain_ident  # by reference, as a user's module is
    t0 = time.perf_counter()
    futs = [client.submit(plain_ident, i, salt, pure=False) for i in range(n)]
    client.gather(futs)
    return time.perf_counter() - t0


def ratio_bench(n: int, reps: int, old: str | None) -> None:
    """The executor (and an old copy) against raw ``client.submit``, interleaved."""
    from distributed import Client, LocalCluster

    from ledgerflow_dask import DaskExecutor

    kinds: dict[str, Any] = {"new": DaskExecutor}
    if old:
        sys.path.insert(0, old)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (old, os.environ.get("PYTHONPATH", "")) if p)
        from ledgerflow_dask_old import DaskExecutor as OldExecutor
        kinds["old"] = OldExecutor
    import psutil

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR)
    client = Client(cluster, set_as_default=False)
    procs = [psutil.Process()] + [psutil.Process(pid) for pid in client.run(os.getpid).values()]

    def cpu() -> float:     # driver + scheduler (this process) + workers
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    salt = [int(time.time())]
    secs: dict[str, list[float]] = {"raw": [], **{k: [] for k in kinds}}
    cpus: dict[str, list[float]] = {k: [] for k in secs}

    def measured(kind: str, thunk: Any) -> None:
        c0 = cpu()
        secs[kind].append(thunk())
        cpus[kind].append(cpu() - c0)

    def ours(kind: str, size: int, folder: str) -> float:
        salt[0] += 1
        from tests.perf.bench_dask import salted_fan  # by reference, like raw
        return timed_run(salted_fan, folder, kinds[kind](client=client, direct=True), 2,
                         n=size, salt=salt[0])

    try:
        with tempfile.TemporaryDirectory() as folder:
            raw_submit(client, 100, 0)          # warm-up: imports, connections, pickles
            for kind in kinds:
                ours(kind, 100, folder)
            for _ in range(reps):
                salt[0] += 1
                measured("raw", lambda: raw_submit(client, n, salt[0]))
                for kind in kinds:
                    measured(kind, lambda k=kind: ours(k, n, folder))
    finally:
        client.close()
        cluster.close()
    print(f"fan-out {n}, 2 workers x 1 thread, {reps} interleaved reps, "
          f"load average {os.getloadavg()}")
    for what, table in (("wall", secs), ("cpu", cpus)):
        for kind, xs in table.items():
            ratios = [x / r for x, r in zip(xs, table["raw"], strict=True)]
            line = " ".join(f"{x / n * 1e6:6.0f}" for x in xs)
            extra = "" if kind == "raw" else \
                f"  ratio {' '.join(f'{q:.2f}' for q in ratios)} " \
                f"(median {sorted(ratios)[reps // 2]:.2f}x)"
            print(f"{kind:>4} {what:>4} us/task {line}{extra}")


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
    ap.add_argument("--ratio", type=int, default=0, metavar="N",
                    help="only the executor / raw client.submit ratio of an N-task fan-out")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--old", default=None, metavar="DIR",
                    help="a folder holding an earlier copy as ledgerflow_dask_old")
    args = ap.parse_args()
    if args.ratio:
        ratio_bench(args.ratio, args.reps, args.old)
        return
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
