"""The ``pipeline watch`` command: parse, hold the target's lock, run the watch loop."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any

import click

from ledgerflow.cli.guard import guard
from ledgerflow.cli.options import EXECUTOR, JSON, STORE, WORKERS
from ledgerflow.cli.params import convert_params
from ledgerflow.cli.render import out
from ledgerflow.errors import InputError

from .schedule import Schedule, parse_duration
from .watcher import TriggerStore, Watch, lock_target, watched_paths


@click.command()
@click.argument("target")
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A pipeline parameter, converted by its type annotation.")
@click.option("--path", "paths", multiple=True, metavar="PATH",
              help="Also watch PATH (repeatable); the pipeline's module may name watched "
              "parameters in LEDGERFLOW_WATCH.")
@click.option("--debounce", default="2s", show_default=True, metavar="DURATION",
              help="Start a run once no file changed for this long (e.g. 500ms, 2s).")
@click.option("--every", metavar="DURATION", help="Also run on this interval (e.g. 10m).")
@click.option("--cron", metavar="EXPR", help='Also run on this cron schedule, e.g. "0 * * * *".')
@click.option("--max-runs", type=click.IntRange(1), metavar="N",
              help="Stop after N runs (the catch-up run at start counts).")
@STORE
@EXECUTOR
@WORKERS
@JSON
@guard
def watch(target: str, params: tuple[str, ...], paths: tuple[str, ...], debounce: str,
          every: str | None, cron: str | None, max_runs: int | None, store: str | None,
          executor: str | None, workers: int | None, as_json: bool) -> None:
    """Keep a pipeline's output fresh: run it when watched files change, or on a schedule.

    It runs once at start (catching up with what changed meanwhile), then after
    each change settles; changes made during a run start the next one. Runs are
    ordinary runs recorded with their trigger (pipeline explain RUN_ID says what
    each task did). Ctrl-C stops it (a run in progress is cancelled; the next
    watch catches up).

    \b
    Example:
      pipeline watch recipes/doc_index/pipeline.py -p source=notes/ --debounce 1s
      pipeline watch flows.py --every 10m
    """
    from ledgerflow import control as api
    if every and cron:
        raise InputError("--every and --cron both given", hint="choose one schedule")
    pipe = api.load_target(target)
    values = pipe.bind(**convert_params(pipe, params))
    pipe.build(**values)                     # bad parameters: refused before watching
    api.check_executor(executor)
    schedule = Schedule.every_(every) if every else Schedule.cron_(cron) if cron else None
    watched = watched_paths(pipe, values, paths)
    if not watched and schedule is None:
        raise InputError(f"nothing to watch: pipeline {pipe.name} declares no watched "
                         "parameter and no --path, --every or --cron was given",
                         hint="pass --path FOLDER or --every 10m, or name the parameter in "
                         "the module: LEDGERFLOW_WATCH = ('source',)")
    st = api.open_ledger(store)
    recorded = api.abs_target(target, pipe.name)
    held = lock_target(st, recorded + "\x00" + json.dumps(values, sort_keys=True, default=str))

    def start_run(run_id: str, trigger: dict[str, Any], cancel: threading.Event
                  ) -> dict[str, Any]:
        real = sys.stdout
        sys.stdout = sys.stderr          # a body's or a task's prints: not into our lines
        try:
            run = api.start(pipe, (), values, store=TriggerStore(st, trigger),
                            executor=executor, workers=workers, run_id=run_id,
                            target=recorded, cancel_event=cancel)
        finally:
            sys.stdout = real
        counts: dict[str, int] = {}
        cached = 0
        for t in run.status().tasks.values():
            counts[t.state] = counts.get(t.state, 0) + 1
            cached += t.cached_from is not None
        return {"state": run.state, "counts": counts, "cached": cached,
                "ran": sum(counts.values()) - cached}

    def report(event: dict[str, Any]) -> None:
        if as_json:
            out(json.dumps(event, default=str))
            return
        trig = event["trigger"]
        why = trig["kind"] + (f" ({trig['changes']} change(s): "
                              + ", ".join(os.path.basename(p) for p in trig["paths"][:3])
                              + (" ..." if len(trig["paths"]) > 3 else "") + ")"
                              if trig["paths"] else "")
        if event["event"] == "start":
            out(f"run {event['run_id']}  trigger {why}")
        else:
            detail = event.get("error") or f"{event.get('ran', 0)} ran, " \
                f"{event.get('cached', 0)} cached"
            out(f"run {event['run_id']}  {event['state']}  {detail}  ({event['seconds']:.1f}s)")

    loop = Watch(paths=watched, schedule=schedule, debounce=parse_duration(debounce,
                 "--debounce"), start_run=start_run, new_run_id=api.new_run_id,
                 report=report, max_runs=max_runs)
    presses = {"n": 0}

    def on_signal(signum: int, frame: Any) -> None:
        presses["n"] += 1
        if presses["n"] > 1:
            os._exit(130)
        loop.stop.set()
        loop.cancel.set()
        loop.pending.wake.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    if not as_json:
        what = [f"{len(watched)} path(s)"] if watched else []
        what += [schedule.describe()] if schedule else []
        out(f"watching {pipe.name}: " + ", ".join(what) + "  (Ctrl-C stops)")
    try:
        loop.loop()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if held is not None:
            held.close()
    if not as_json:
        out(f"watch stopped after {loop.runs} run(s)")
