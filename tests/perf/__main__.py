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


def peak_rss_child(shape: str, n: int, store: str) -> None:
    """Run one pipeline in this (fresh) process and print its peak RSS in KiB.

    VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent's
    memory across fork and exec, so a big parent would mask the child.
    """
    pipe = chain if shape == "chain" else fanout
    run = pipe.run(n=n, store=store, executor="inline")
    assert run.state == "succeeded", run.state
    status = Path("/proc/self/status").read_text()
    print(next(int(line.split()[1]) for line in status.splitlines()
               if line.startswith("VmHWM:")))


def _env() -> dict[str, str]:
    """The environment of child processes: this checkout first on the path.

    Bytecode is written (a user's installation has it): with
    PYTHONDONTWRITEBYTECODE set, every child process would compile each
    changed module again, which is not what start-up costs.
    """
    path = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _first_release() -> bool:
    """True when measuring the first release (tuple records), for before/after runs."""
    import ledgerflow.store
    return hasattr(ledgerflow.store, "RECORD_KINDS")


def _task_records(key: str, seq: int, now: float) -> list[Any]:
    """The records one trivial task writes, in this release's format."""
    if _first_release():     # plain tuples
        return [("T", key, "noop", key, None, None, [], "v1", now),
                ("E", seq, key, 0, None, "pending", "", now),
                ("E", seq + 1, key, 0, "pending", "ready", "", now),
                ("E", seq + 2, key, 1, "ready", "running", "attempt 1", now),
                ("A", key, 1, "ok", now, now, "", "", ""),
                ("R", key, 1, "f" * 32, "h" * 32, "json", "1", None, 1, None),
                ("E", seq + 3, key, 1, "running", "succeeded", "", now)]
    from ledgerflow.records import AttemptEnded, ResultRecorded, TaskCreated, Transition
    return [TaskCreated(key, "noop", key, None, None, [], "v1", now),
            Transition(seq, key, 0, None, "pending", "", now),
            Transition(seq + 1, key, 0, "pending", "ready", "", now),
            Transition(seq + 2, key, 1, "ready", "running", "attempt 1", now),
            AttemptEnded(key, 1, "ok", now, now, "", "", ""),
            ResultRecorded(key, 1, "f" * 32, "h" * 32, "json", "1", None, 1, None),
            Transition(seq + 3, key, 1, "running", "succeeded", "", now)]


def journal_append_us(folder: Path, n: int = 10_000) -> float:
    """Encoding and appending one task's records to the DuckDB store's journal, per task
    (one commit per task: the worst case, what an inline chain does)."""
    from ledgerflow.config import Settings
    from ledgerflow.plugins import get_plugin_manager
    st = get_plugin_manager().hook.ledgerflow_make_store(
        name="duckdb", settings=Settings(store=str(folder / "append.duckdb")))
    now = time.time()
    head: list[Any]
    if _first_release():
        head = [("D", "r", "p", None, "{}", now, "{}"), ("S", "running", "", now)]
    else:
        from ledgerflow.records import RunDefined, RunStateChanged
        head = [RunDefined("r", "p", None, "{}", now, "{}"), RunStateChanged("running", "", now)]
    lease = st.create_run("r", head)
    batches = [_task_records(f"noop-{i}", 4 * i + 1, now) for i in range(n)]
    t = time.perf_counter()
    for records in batches:
        st.append(lease, records)
    dt = time.perf_counter() - t
    st.release(lease)
    return dt / n * 1e6


def peak_rss_kib(shape: str, n: int, store: str) -> int:
    env = _env()
    out = subprocess.run([sys.executable, "-m", "tests.perf", "--rss-child", shape, str(n),
                          store], check=True, env=env, capture_output=True, text=True).stdout
    return int(out.split()[-1])


def slope(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares fit of seconds = fixed + per_task * n; returns (per_task us, fixed s)."""
    k = len(points)
    mx = sum(n for n, _ in points) / k
    my = sum(t for _, t in points) / k
    b = sum((n - mx) * (t - my) for n, t in points) / sum((n - mx) ** 2 for n, _ in points)
    return b * 1e6, my - b * mx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1k and 10k tasks only")
    ap.add_argument("--out", default="perf-results.json")
    ap.add_argument("--rss-child", nargs=3, metavar=("SHAPE", "N", "STORE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        shape, n, store = args.rss_child
        peak_rss_child(shape, int(n), store)
        return
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
    seconds: dict[str, list[tuple[int, float]]] = {}
    for n in sizes:
        for shape, pipe in (("chain", chain), ("fan-out", fanout)):
            mem, _ = per_task(pipe, n, f"memory:{shape}-{n}", "inline")
            add(f"{shape} {n} memory inline per task", mem, "us", "<= 15")
            seconds.setdefault(f"{shape} memory inline", []).append((n, mem * n / 1e6))
            for executor, limit in (("inline", "50"), ("threads", "100")):
                store = str(tmp / f"{shape}-{executor}-{n}.duckdb")
                per_task(pipe, 50, store, executor)       # the ledger file exists already
                us, _ = per_task(pipe, n, store, executor)
                add(f"{shape} {n} duckdb {executor} per task (x{us / mem:.1f} memory)", us,
                    "us", f"<= {limit}")
                seconds.setdefault(f"{shape} duckdb {executor}", []).append((n, us * n / 1e6))
    add("journal append (encode + write), one task's 7 records a commit", journal_append_us(tmp),
        "us", "-")
    # linear growth: the slope of a least-squares line through the run times
    for name, points in seconds.items():
        per, fixed = slope(points)
        add(f"slope {name}, {sizes[0]}-{sizes[-1]} tasks (fixed {fixed * 1e3:.0f} ms)", per,
            "us", "linear")
    # resident memory: peak of a whole process, above the peak of a 1-task run
    base = peak_rss_kib("chain", 1, str(tmp / "rss-base.duckdb"))
    n = sizes[-1]
    for shape in ("chain", "fan-out"):
        kib = peak_rss_kib(shape, n, str(tmp / f"rss-{shape}.duckdb"))
        # the target is per task at scale: at 10k the fold's fixed ~50 MB dominates
        add(f"peak RSS per task above a 1-task run ({n} {shape}, duckdb inline)",
            (kib - base) * 1024 / n, "B", "< 2048" if n >= 100_000 else "-", ratio=False)
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
    env = _env()
    target = f"{Path(__file__).resolve()}:chain"
    # warm-up, untimed: the CLI and every plugin imported once (bytecode written)
    subprocess.run([sys.executable, "-m", "ledgerflow", "plugins"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
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
