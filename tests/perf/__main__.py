"""Benchmarks: ``python -m tests.perf [--quick] [--out perf-results.json]``.

Prints one table (figure, value, target, ratio to a plain Python call in the
same run) and writes it as JSON. Never part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ledgerflow
from ledgerflow import pipeline, task


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


def since(start: float) -> float:
    """Seconds elapsed since ``start`` (a ``perf_counter`` reading)."""
    return time.perf_counter() - start


def plain_call_us(n: int = 200_000) -> float:
    def f(x: int) -> int:
        return x
    t = time.perf_counter()
    x = 0
    for _ in range(n):
        x = f(x)
    return (time.perf_counter() - t) / n * 1e6


def per_task(pipe: Any, n: int, store: str, executor: str) -> tuple[float, str]:
    t = time.perf_counter()
    run = pipe.run(n=n, store=store, executor=executor, workers=4)
    dt = time.perf_counter() - t
    assert run.state == "succeeded", run.state
    return dt / n * 1e6, run.run_id


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1k and 10k tasks only")
    ap.add_argument("--out", default="perf-results.json")
    args = ap.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    tmp = Path(tempfile.mkdtemp(prefix="lf-perf-"))
    plain = plain_call_us()
    rows: list[dict[str, Any]] = []

    def add(figure: str, value: float, unit: str, target: str, ratio: bool = True) -> None:
        rows.append({"figure": figure, "value": round(value, 3), "unit": unit,
                     "target": target,
                     "x_plain_call": round(value / plain, 1) if ratio else None})
        print(f"{figure:<48} {value:>12.3f} {unit:<4} target {target:<10}"
              + (f" {value / plain:>10.0f}x plain" if ratio else ""), flush=True)

    add("plain Python call", plain, "us", "-")
    per_task(chain, 50, "memory:warm-up", "inline")     # imports, code versions
    for n in sizes:
        for shape, pipe in (("chain", chain), ("fan-out", fanout)):
            mem, _ = per_task(pipe, n, f"memory:{shape}-{n}", "inline")
            add(f"{shape} {n} memory inline per task", mem, "us", "<= 15")
            for executor, limit in (("inline", "50"), ("threads", "100")):
                store = str(tmp / f"{shape}-{executor}-{n}.duckdb")
                per_task(pipe, 50, store, executor)       # the ledger file exists already
                us, _ = per_task(pipe, n, store, executor)
                add(f"{shape} {n} duckdb {executor} per task (x{us / mem:.1f} memory)", us,
                    "us", f"<= {limit}")
    # ledger size, resume with one task left
    n = sizes[-1]
    store = str(tmp / "resume.duckdb")
    us, run_id = per_task(chain, n, store, "inline")
    size = os.path.getsize(store) + sum(f.stat().st_size for f in Path(store + ".d").rglob("*")
                                        if f.is_file())
    add(f"ledger bytes per task ({n} chain)", size / n, "B", "< 1024", ratio=False)
    import duckdb
    con = duckdb.connect(store)
    last = con.execute("SELECT task_key FROM tasks WHERE run_id = ? ORDER BY position DESC, "
                       "rowid DESC LIMIT 1", [run_id]).fetchall()[0][0]
    con.execute("UPDATE tasks SET state = 'failed' WHERE run_id = ? AND task_key = ?",
                [run_id, last])
    con.execute("UPDATE runs SET state = 'failed' WHERE run_id = ?", [run_id])
    con.close()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    target = f"{Path(__file__).resolve()}:chain"
    t = time.perf_counter()
    ledgerflow.plan_resume(run_id, store=store)
    add(f"resume --plan, {n}-task run, one left (in process)", since(t), "s",
        "< 1", ratio=False)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ledgerflow", "resume", run_id, "--plan", "--store",
                    store], check=True, env=env, stdout=subprocess.DEVNULL)
    add(f"pipeline resume --plan, {n}-task run, one left", since(t), "s",
        "< 1", ratio=False)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ledgerflow", "resume", run_id, "--store", store,
                    "--executor", "inline"], check=True, env=env, stdout=subprocess.DEVNULL)
    add(f"pipeline resume, {n}-task run, one left", since(t), "s", "< 3",
        ratio=False)
    # graph building
    for m in sizes:
        t = time.perf_counter()
        chain.build(n=m)
        add(f"trace a {m}-call pipeline body", since(t), "s",
            "< 1" if m == 100_000 else "-", ratio=False)
    # start-up
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import ledgerflow"], check=True, env=env)
    add("import ledgerflow (process)", since(t), "s", "< 0.3", ratio=False)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ledgerflow", "run", target, "-p", "n=100",
                    "--store", str(tmp / "startup.duckdb"), "--json"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    add("pipeline run, 100 tasks, whole process", since(t), "s", "< 0.5",
        ratio=False)
    doc = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "platform": platform.platform()}, "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.out}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
