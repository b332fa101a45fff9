"""Benchmark the console on a 100,000-task run; prints a table, writes JSON.

Run from the repository root (not collected by pytest: no ``test_`` prefix)::

    .venv/bin/python tests/perf/bench_console.py [--n 100000] [--repeat 5] [--out FILE]

Builds the run the memory-light way (a fan-out of a trivial task, ``duckdb``
store, ``inline`` executor, in a child process), starts a real ``pipeline
console`` on a free port, and times each page and JSON endpoint over HTTP:
the first request and the median of ``--repeat`` more. Targets: the run page,
its JSON and the ``pipeline status --json`` document answer in under 2 s;
the run page's HTML is under 1 MB. With chromium and Playwright installed it
also times the run page in a browser until the timeline is drawn.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ledgerflow import pipeline, task  # noqa: E402


@task(cache=False)
def noop(x: int) -> int:
    return x


@pipeline
def fanout(n: int = 100_000):
    return noop.map(list(range(n)))


def make_run(store: str, n: int) -> str:
    """Create the run in a child process (its memory is not the benchmark's)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "from tests.perf.bench_console import fanout;"
            "r = fanout.run(n=int(sys.argv[2]), store=sys.argv[3], executor='inline');"
            "print(r.run_id, r.state)")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(n), store], check=True,
                         capture_output=True, text=True).stdout.split()
    assert out[1] == "succeeded", out
    return out[0]


def fetch(url: str) -> tuple[float, int, int]:
    """Seconds to the last byte, status and size of one GET."""
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
        status = resp.status
    return time.perf_counter() - t, status, len(body)


def browser_seconds(url: str) -> float | None:
    """Seconds from navigation until the run page's timeline is drawn in chromium."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not os.path.exists("/usr/bin/chromium"):
        return None
    from tests.console.conftest import CHROMIUM, CHROMIUM_ARGS
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = b.new_page()
            t = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#timeline svg")
            return time.perf_counter() - t
        finally:
            b.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="bench_console.json")
    args = ap.parse_args()
    from tests.console.conftest import start_console

    tmp = Path(tempfile.mkdtemp(prefix="lf-console-bench-"))
    store = str(tmp / "ledger.duckdb")
    t = time.perf_counter()
    rid = make_run(store, args.n)
    made = time.perf_counter() - t
    print(f"made a {args.n:,}-task run in {made:.1f} s: {rid}", flush=True)
    con = start_console(store, tmp / "console.log")
    rows: list[dict[str, Any]] = []
    try:
        targets = {f"runs/{rid}": 2.0, f"api/runs/{rid}/page": 2.0, f"api/runs/{rid}": 2.0}
        paths = [f"runs/{rid}", f"api/runs/{rid}/page", f"api/runs/{rid}", "",
                 f"api/runs/{rid}/timeline", f"runs/{rid}/items?task=noop",
                 f"runs/{rid}/graph.svg", f"runs/{rid}/inspect?task=noop%5B7%5D",
                 f"runs/{rid}/lineage?task=noop%5B7%5D"]
        print(f"{'endpoint':<44} {'first s':>8} {'median s':>9} {'bytes':>12}  target")
        for path in paths:
            first, status, size = fetch(con.base + path)
            assert status == 200, (path, status)
            times = [fetch(con.base + path)[0] for _ in range(args.repeat)]
            med = statistics.median(times)
            target = targets.get(path)
            ok = target is None or max(first, med) < target
            if path == f"runs/{rid}":
                ok = ok and size < 1_000_000
            label = path.replace(rid, "RID") or "/ (runs page)"
            note = "" if target is None else (
                f"< {target:g} s" + (", < 1 MB" if path == f"runs/{rid}" else "")
                + ("  ok" if ok else "  MISSED"))
            print(f"{label:<44} {first:>8.3f} {med:>9.3f} {size:>12,}  {note}", flush=True)
            rows.append({"endpoint": label, "first_s": round(first, 3),
                         "median_s": round(med, 3), "bytes": size, "target_s": target,
                         "ok": ok})
        shown = browser_seconds(con.base + f"runs/{rid}")
        if shown is not None:
            print(f"{'run page in chromium until the timeline shows':<44} {shown:>8.3f}")
            rows.append({"endpoint": "browser: run page until the timeline shows",
                         "first_s": round(shown, 3)})
    finally:
        con.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "load": os.getloadavg()}, "tasks": args.n, "make_run_s": round(made, 1),
           "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.out}")
    if not all(r.get("ok", True) for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
