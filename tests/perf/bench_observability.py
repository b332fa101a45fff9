"""Benchmark: what each observer costs per task, and what it adds to start-up.

``python -m tests.perf.bench_observability [--tasks 10000] [--repeat 3] [--json FILE]``

Each figure is measured in fresh processes (the way a user turns an
observer on: its environment variable), medians of ``--repeat`` runs:

* per-task wall time of a 10,000-task fan-out (threads executor, 4 workers)
  and of a 10,000-task chain, with no observer, each observer alone, and
  all three; the overhead is the difference to "off";
* ``import ledgerflow`` and a 1-task ``pipeline run``, off and on.

Exporters: OpenTelemetry spans go through the SDK's BatchSpanProcessor to an
exporter that drops them (span creation and batching are measured, not a
collector's network); OpenLineage events go to a file with the client's
file transport; Prometheus counts go to a textfile. Never part of the test
suite; on a shared 2-core machine run it when the load is low.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

RUN = textwrap.dedent("""
    import os, sys, time
    observer = sys.argv[1]; shape = sys.argv[2]; n = int(sys.argv[3]); store = sys.argv[4]
    if observer in ("otel", "all"):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
        class Drop(SpanExporter):
            spans = 0
            def export(self, spans):
                Drop.spans += len(spans)
                return SpanExportResult.SUCCESS
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=1 << 16))
        from ledgerflow_observability import otel
        otel.enable(provider)
    from ledgerflow import pipeline, task

    @task(cache=False)
    def noop(x: int = 0) -> int:
        return x

    @pipeline
    def fanout(n: int):
        return noop.map(list(range(n)))

    @pipeline
    def chain(n: int):
        x = noop(0)
        for _ in range(n - 1):
            x = noop(x)
        return x

    sys.setrecursionlimit(100000)
    pipe = fanout if shape == "fanout" else chain
    t = time.perf_counter()
    run = pipe.run(n=n, store=store, executor="threads", workers=4)
    wall = time.perf_counter() - t
    assert run.state == "succeeded", run.state
    if observer in ("otel", "all"):
        provider.force_flush()
        assert Drop.spans >= n, Drop.spans
    print(wall)
""")

ONE = textwrap.dedent("""
    from ledgerflow import task, pipeline
    @task
    def one() -> int:
        return 1
    @pipeline
    def p():
        return one()
""")

OBSERVERS = ("off", "otel", "openlineage", "prometheus", "all")


def env_for(observer: str, folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEDGERFLOW_", "OTEL_", "OPENLINEAGE"))}
    if observer in ("openlineage", "all"):
        env["LEDGERFLOW_OPENLINEAGE"] = f"file:{folder / 'events.jsonl'}"
    if observer in ("prometheus", "all"):
        env["LEDGERFLOW_PROMETHEUS"] = str(folder / "metrics.prom")
    return env


def per_task_us(observer: str, shape: str, n: int, repeat: int) -> float:
    walls = []
    for i in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d)
            out = subprocess.run([sys.executable, "-c", RUN, observer, shape, str(n),
                                  str(folder / f"l{i}.duckdb")], capture_output=True,
                                 text=True, env=env_for(observer, folder), cwd=d, timeout=1800)
            if out.returncode != 0:
                raise SystemExit(f"{observer}/{shape} failed:\n{out.stderr}")
            if observer in ("openlineage", "all"):
                lines = (folder / "events.jsonl").read_text().count("\n")
                assert lines >= 2 * n, lines
            walls.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(walls) / n * 1e6


def startup_ms(argv: list[str], env: dict[str, str], cwd: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(argv, check=True, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def startup(out: dict[str, float], repeat: int) -> None:
    """Start-up times: ``import ledgerflow`` and a 1-task run, off and with each observer."""
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "p.py").write_text(ONE)
        py = [sys.executable, "-c"]
        out["python -c pass"] = startup_ms([*py, "pass"], env_for("off", folder), d,
                                           repeat * 5)
        out["import ledgerflow"] = startup_ms(
            [*py, "import ledgerflow"], env_for("off", folder), d, repeat * 5)
        out["import the three hookimpl modules"] = startup_ms(
            [*py, "import ledgerflow_observability.otel, ledgerflow_observability.openlineage, "
                  "ledgerflow_observability.prometheus, sys; "
                  "assert not {'opentelemetry', 'openlineage', 'prometheus_client'} & "
                  "set(sys.modules)"], env_for("off", folder), d, repeat * 5)
        for observer in ("off", "openlineage", "prometheus"):
            env = env_for(observer, folder)
            out[f"pipeline run (1 task), {observer}"] = startup_ms(
                [sys.executable, "-m", "ledgerflow", "run", "p.py", "--store",
                 str(folder / f"s-{observer}.duckdb")], env, d, repeat * 3)
        env = env_for("off", folder)
        env["OTEL_TRACES_EXPORTER"] = "none"     # on (LEDGERFLOW_OTEL), no exporter
        env["LEDGERFLOW_OTEL"] = "1"
        out["pipeline run (1 task), otel"] = startup_ms(
            [sys.executable, "-m", "ledgerflow", "run", "p.py", "--store",
             str(folder / "s-otel.duckdb")], env, d, repeat * 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shapes", default="fanout,chain")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--skip-startup", action="store_true",
                    help="measure only the per-task figures")
    args = ap.parse_args()
    results: dict[str, Any] = {"tasks": args.tasks, "repeat": args.repeat,
                               "load": os.getloadavg()[0], "per_task_us": {},
                               "startup_ms": {}}
    if not args.skip_startup:
        startup(results["startup_ms"], args.repeat)
    for shape in args.shapes.split(","):
        row = results["per_task_us"].setdefault(shape, {})
        for observer in OBSERVERS:
            row[observer] = per_task_us(observer, shape, args.tasks, args.repeat)
            print(f"{shape:<7} {observer:<12} {row[observer]:8.1f} us/task  "
                  f"(+{row[observer] - row['off']:.1f})", flush=True)
    print()
    for k, v in results["startup_ms"].items():
        print(f"{k:<48} {v:8.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
