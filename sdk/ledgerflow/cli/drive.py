"""The driving commands: ``run``, ``submit``, ``resume``, ``cancel``.

A run is driven in this process with Ctrl-C as cancel and a progress display,
then its closing table is printed and the exit code says how it ended
(0 succeeded, 1 failed or cancelled, 3 waiting for approvals).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import click

from .. import control as api
from ..pipeline import Pipeline
from ..states import RunState
from .guard import guard
from .options import DASK, EXECUTOR, JSON, LOGS, PARAMS, STORE, WAIT, WORKERS, main
from .params import convert_params
from .render import ROW_LIMIT, dumps, out, progress_for, run_dumps, summary


def drive(start: Callable[[threading.Event, Any], api.Run], as_json: bool, run_id: str,
          header: str | None = None) -> api.Run:
    """Drive a run in this process with Ctrl-C as cancel and a progress display.

    ``header`` is printed once the run is really recorded (its first transition
    or its takeover), so a refusal (a read-only ledger, a damaged one, a run that
    already succeeded) prints no run line. With ``--json`` stdout holds the
    document alone: anything else written meanwhile (a pipeline body's prints,
    echoed logs) goes to stderr.
    """
    if as_json:
        real, sys.stdout = sys.stdout, sys.stderr
        try:
            return _driven(start, True, run_id, None)
        finally:
            sys.stdout = real
    return _driven(start, False, run_id, header)


class Announced:
    """The progress display, started (after ``header``) at the run's first news."""

    def __init__(self, as_json: bool, header: str | None) -> None:
        self.as_json = as_json
        self.header = header
        self.display: Any = None
        self.started = False

    def _start(self, counts: dict[str, int] | None) -> Any:
        if not self.started:
            self.started = True
            if self.header is not None:
                out(self.header)
            self.display = progress_for(self.as_json, counts)
        return self.display

    def begin(self, counts: dict[str, int]) -> None:
        """A resumed run's counts, read by the resume once it took the run over."""
        display = self._start(counts)
        if display is not None:
            display.begin(counts)

    def __call__(self, key: str, old: str, new: str) -> None:
        display = self.display if self.started else self._start(None)
        if display is not None:
            display(key, old, new)

    def close(self) -> None:
        if self.display is not None:
            self.display.close()


def _driven(start: Callable[[threading.Event, Any], api.Run], as_json: bool, run_id: str,
            header: str | None) -> api.Run:
    cancel = threading.Event()
    presses = {"n": 0}

    def on_sigint(signum: int, frame: Any) -> None:
        presses["n"] += 1
        if presses["n"] == 1:
            cancel.set()
            out("\ncancelling: waiting for running tasks to stop "
                "(Ctrl-C again to exit at once; the run stays resumable)", err=True)
        else:
            out(f"\nstopped at once; the tasks that were running are resumed as lost: "
                f"pipeline resume {run_id}", err=True)
            os._exit(130)

    old = signal.signal(signal.SIGINT, on_sigint)
    # --json: no display, so the runner queues no transitions for one
    progress = None if as_json else Announced(as_json, header)
    try:
        return start(cancel, progress)
    finally:
        signal.signal(signal.SIGINT, old)
        if progress is not None:
            progress.close()


def shape(graph: Any) -> str:
    """``5 tasks``, or ``3 tasks + 2 fan-outs (their tasks are made as they run)``: what
    the graph holds before it runs (a fan-out's items are known only then)."""
    maps = sum(1 for node in graph if node.is_map)
    plain = len(graph) - maps
    text = f"{plain} task{'s' if plain != 1 else ''}"
    if maps:
        text += (f" + {maps} fan-out{'s' if maps != 1 else ''} "
                 "(their tasks are made as they run)")
    return text


def finish(run: api.Run, as_json: bool) -> None:
    """Print how ``run`` ended (its table, or its JSON) and exit with its code."""
    view = api.view(run, summed_above=None if as_json else ROW_LIMIT, upstream=not as_json)
    waiting = view.state == RunState.WAITING
    if as_json:
        out(run_dumps(view))
    else:
        summary(view)
        if waiting:
            pending_lines(run.approvals(pending_only=True), view.run_id)
        if view.state == RunState.SUCCEEDED:
            out(f"result:  {result_preview(run, view)}")
        out(f"details: pipeline status {view.run_id}")
        if view.state != RunState.SUCCEEDED:
            out(f"resume:  pipeline resume {view.run_id}"
                + ("   (once the approvals are decided)" if waiting else ""))
    sys.stdout.flush()
    run.settle()    # the command ends with the ledger's tables holding the run (for SQL)
    sys.exit(0 if view.state == RunState.SUCCEEDED else 3 if waiting else 1)


#: Above this many tasks the closing lines do not read the result (``pipeline result``).
PREVIEW_TASKS = 50
#: Characters of a result shown after a run.
PREVIEW_CHARS = 200


def result_preview(run: api.Run, view: Any) -> str:
    """The pipeline's result in one line (cut), or where to read it for a big run."""
    if view.groups is not None or len(view.tasks) > PREVIEW_TASKS:
        return f"pipeline result {view.run_id}"
    try:
        text = repr(api.result_of(run, view))
    except Exception as exc:    # an unreadable result must not hide how the run ended
        return f"not shown ({type(exc).__name__}: {exc}); pipeline result {view.run_id}"
    if len(text) > PREVIEW_CHARS:
        text = text[:PREVIEW_CHARS] + f"...  (all of it: pipeline result {view.run_id})"
    return text


def pending_lines(rows: list[dict[str, Any]], run_id: str) -> None:
    """What waits for a decision, and how to decide (compact for big fan-outs)."""
    if not rows:
        return
    out(f"{len(rows)} approval(s) waiting:")
    for r in rows[:20]:
        out(f"  {r['task_key']}  {r['action']}: {r['summary']}  digest {r['digest'][:12]}")
    if len(rows) > 20:
        names: dict[str, int] = {}
        for r in rows[20:]:
            name = r["task_key"].split("[", 1)[0]
            names[name] = names.get(name, 0) + 1
        out("  ... and " + ", ".join(f"{n} more of {k}" for k, n in names.items()))
    first = rows[0]
    out(f"approve: pipeline approve {run_id} '{first['task_key']}' --digest "
        f"{first['digest'][:12]} --resume")
    out(f"reject:  pipeline reject {run_id} '{first['task_key']}' --reason '...'")


@main.command()
@click.argument("target")
@PARAMS
@STORE
@EXECUTOR
@WORKERS
@DASK
@click.option("--fail-fast", is_flag=True, envvar="LEDGERFLOW_FAIL_FAST",
              help="Stop dispatching at the first failure [env LEDGERFLOW_FAIL_FAST].")
@LOGS
@WAIT
@JSON
@guard
def run(target: str, params: tuple[str, ...], store: str | None, executor: str | None,
        workers: int | None, dask_address: str | None, fail_fast: bool, logs: bool,
        wait_approvals: bool, as_json: bool) -> None:
    """Run a pipeline: FILE.py[:PIPELINE], a module:PIPELINE, or a .json/.toml spec.

    \b
    Example:
      pipeline run recipes/doc_index/pipeline.py -p source=docs/ --workers 2
    """
    real = sys.stdout
    if as_json:
        sys.stdout = sys.stderr     # a pipeline module's or body's prints: not into the JSON
    try:
        pipe = api.load_target(target)
        values = convert_params(pipe, params)
        graph = pipe.build(**values)            # validate before anything is written
    finally:
        sys.stdout = real
    api.check_executor(executor)
    if type(pipe).admit is not Pipeline.admit:  # e.g. a draft nobody approved: refused here
        pipe.admit(api.open_ledger(store))
    run_id = api.new_run_id()
    header = f"run {run_id}  pipeline {pipe.name}  ({shape(graph)})"

    def start(cancel: threading.Event, progress: Any) -> api.Run:
        return api.start(pipe, (), values, store=store, executor=executor, workers=workers,
                         fail_fast=fail_fast or None, run_id=run_id,
                         target=api.abs_target(target, pipe.name), progress=progress,
                         cancel_event=cancel, dask_address=dask_address, graph=graph,
                         logs=logs or None, wait_approvals=wait_approvals or None)

    finish(drive(start, as_json, run_id, header), as_json)


@main.command()
@click.argument("target")
@PARAMS
@STORE
@JSON
@guard
def submit(target: str, params: tuple[str, ...], store: str | None, as_json: bool) -> None:
    """Record a run without driving it: a worker or `pipeline resume` drives it.

    The run is validated first and recorded ``submitted``; ``pipeline worker``
    (PostgreSQL store) claims it, or ``pipeline resume RUN_ID`` drives it here.

    \b
    Example:
      pipeline submit flows.py -p n=10 --store postgresql://db.example/ledger
    """
    pipe = api.load_target(target)
    values = convert_params(pipe, params)
    run_id = api.submit(target, params=values, store=store)
    if as_json:
        out(dumps({"run_id": run_id, "pipeline": pipe.name, "state": RunState.SUBMITTED.value}))
    else:
        out(f"run {run_id}  pipeline {pipe.name}  submitted")
        if api.ledger_kind(store) == "postgres":
            out(f"drive it: pipeline worker --store ...   or: pipeline resume {run_id}")
        else:       # pipeline worker claims runs of a PostgreSQL ledger only
            out(f"drive it: pipeline resume {run_id}")


@main.command()
@click.argument("run_id")
@click.option("--plan", is_flag=True, envvar="LEDGERFLOW_PLAN",
              help="Show what would be reused and re-run; run nothing [env LEDGERFLOW_PLAN].")
@STORE
@EXECUTOR
@WORKERS
@DASK
@LOGS
@WAIT
@JSON
@guard
def resume(run_id: str, plan: bool, store: str | None, executor: str | None,
           workers: int | None, dask_address: str | None, logs: bool, wait_approvals: bool,
           as_json: bool) -> None:
    """Continue a run: keep its successes, retry lost tasks, reset failed ones.

    \b
    Example:
      pipeline resume 20261129-194138-3fa9c2 --plan
    """
    if plan:
        if as_json:
            rows = api.plan_resume(run_id, store=store)
            out(dumps([{"key": k, "action": a, "why": w} for k, a, w in rows]))
            return
        counts, changed = api.plan_summary(run_id, store=store)
        out(f"resume plan for {run_id}: " + ", ".join(
            f"{n} {a}" for a, n in sorted(counts.items())))
        for key, action, why in changed:
            out(f"  {action:<6} {key}: {why}")
        return
    api.check_executor(executor)
    handle = api.get_run(run_id, store=store, check=False)     # one store for all of it

    def start(cancel: threading.Event, progress: Any) -> api.Run:
        return api.resume(run_id, store=handle.store, executor=executor, workers=workers,
                          progress=progress, cancel_event=cancel, dask_address=dask_address,
                          logs=logs or None, wait_approvals=wait_approvals or None)

    finish(drive(start, as_json, run_id, f"run {run_id}  resuming"), as_json)


@main.command()
@click.argument("run_id")
@STORE
@guard
def cancel(run_id: str, store: str | None) -> None:
    """Ask a running run to cancel (from any process).

    \b
    Example:
      pipeline cancel 20261129-194138-3fa9c2
    """
    handle = api.get_run(run_id, store=store)
    before = api.head(handle)
    done = api.cancel(run_id, store=handle.store)
    if done == "requested":
        out(f"cancel requested for {run_id}; its driver stops within a second")
    elif before.state == RunState.SUBMITTED:
        out(f"run {run_id} cancelled (no driver had taken it)")
    else:
        out(f"run {run_id} cancelled (no process was driving it)")
