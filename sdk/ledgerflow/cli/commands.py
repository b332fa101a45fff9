"""The ``pipeline`` commands: parse, call the API, render; nothing else.

Plugins add commands through the ``ledgerflow_add_cli_commands`` hook; they
are loaded when the command line is parsed.
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
from ..errors import InputError, PluginError
from ..launch import Run
from ..states import RunState
from ..views import counts_text, lineage_of
from .guard import guard
from .params import convert_params
from .render import dumps, out, progress_for, summary

STORE = click.option("--store", envvar="LEDGERFLOW_STORE", metavar="PATH|URL",
                     help="Ledger file, or a postgresql:// URL [env LEDGERFLOW_STORE; "
                     "default .ledgerflow/ledger.duckdb].")
JSON = click.option("--json", "as_json", is_flag=True, envvar="LEDGERFLOW_JSON",
                    help="Print JSON instead of a table [env LEDGERFLOW_JSON].")
EXECUTOR = click.option("--executor", envvar="LEDGERFLOW_EXECUTOR", metavar="NAME",
                        help="An executor plugin: inline, threads (default), processes, "
                        "mock, dask... (pipeline plugins lists them) [env LEDGERFLOW_EXECUTOR].")
WORKERS = click.option("--workers", envvar="LEDGERFLOW_WORKERS", type=click.IntRange(1),
                       help="Tasks run at once [env LEDGERFLOW_WORKERS; default 4].")
DASK = click.option("--dask-address", envvar="LEDGERFLOW_DASK_ADDRESS", metavar="URL",
                    help="Dask scheduler, e.g. tcp://127.0.0.1:8786 [env LEDGERFLOW_DASK_ADDRESS].")


class PipelineGroup(click.Group):
    """The command group; plugin commands are added the first time it is asked."""

    _plugins_loaded = False

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        try:
            from ..plugins import get_plugin_manager
            get_plugin_manager().hook.ledgerflow_add_cli_commands(group=self)
        except PluginError as exc:   # a broken plugin must not hide the core commands
            out(f"Warning: plugin commands not loaded: {exc}", err=True)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_plugins()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load_plugins()
        return super().get_command(ctx, cmd_name)


@click.group(cls=PipelineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="LEDGERFLOW_DEBUG",
              help="Show tracebacks for errors (also accepted after the command).")
@click.version_option(package_name="ledgerflow")
def main(debug: bool) -> None:
    """Run, inspect, cancel and resume ledgerflow pipelines.

    \b
    Example:
      pipeline run flows.py -p n=10
      pipeline status RUN_ID
      pipeline resume RUN_ID
    """


def _drive(start: Callable[[threading.Event, Any], Run], as_json: bool,
           initial: dict[str, int] | None = None) -> Run:
    """Drive a run in this process with Ctrl-C as cancel and a progress display."""
    cancel = threading.Event()
    presses = {"n": 0}

    def on_sigint(signum: int, frame: Any) -> None:
        presses["n"] += 1
        if presses["n"] == 1:
            cancel.set()
            out("\ncancelling: waiting for running tasks to stop "
                "(Ctrl-C again to exit at once; the run stays resumable)", err=True)
        else:
            os._exit(130)

    old = signal.signal(signal.SIGINT, on_sigint)
    progress = progress_for(as_json, initial)
    try:
        return start(cancel, progress)
    finally:
        signal.signal(signal.SIGINT, old)
        if progress is not None:
            progress.close()


def _finish(run: Run, as_json: bool) -> None:
    view = run.store.get_run(run.run_id, upstream=False)
    if as_json:
        out(dumps(view.as_json()))
    else:
        summary(view)
        out(f"details: pipeline status {view.run_id}")
        if view.state != RunState.SUCCEEDED:
            out(f"resume:  pipeline resume {view.run_id}")
    sys.exit(0 if view.state == RunState.SUCCEEDED else 1)


@main.command()
@click.argument("target")
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A pipeline parameter, converted by its type annotation.")
@STORE
@EXECUTOR
@WORKERS
@DASK
@click.option("--fail-fast", is_flag=True, envvar="LEDGERFLOW_FAIL_FAST",
              help="Stop dispatching at the first failure [env LEDGERFLOW_FAIL_FAST].")
@JSON
@guard
def run(target: str, params: tuple[str, ...], store: str | None, executor: str | None,
        workers: int | None, dask_address: str | None, fail_fast: bool, as_json: bool) -> None:
    """Run a pipeline: FILE.py[:PIPELINE], a module:PIPELINE, or a .json/.toml spec.

    \b
    Example:
      pipeline run recipes/doc_index/pipeline.py -p source=docs/ --workers 2
    """
    pipe = api.load_target(target)
    values = convert_params(pipe, params)
    graph = pipe.build(**values)            # validate before anything is written
    api.check_executor(executor)
    run_id = api.new_run_id()
    if not as_json:
        out(f"run {run_id}  pipeline {pipe.name}  ({len(graph)} steps)")

    def start(cancel: threading.Event, progress: Any) -> Run:
        return api.start(pipe, (), values, store=store, executor=executor, workers=workers,
                         fail_fast=fail_fast or None, run_id=run_id,
                         target=api.abs_target(target, pipe.name), progress=progress,
                         cancel_event=cancel, dask_address=dask_address, graph=graph)

    _finish(_drive(start, as_json), as_json)


@main.command()
@click.argument("target")
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A pipeline parameter, converted by its type annotation.")
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
        out(f"drive it: pipeline worker --store ...   or: pipeline resume {run_id}")


@main.command()
@click.argument("run_id")
@click.option("--plan", is_flag=True, envvar="LEDGERFLOW_PLAN",
              help="Show what would be reused and re-run; run nothing [env LEDGERFLOW_PLAN].")
@STORE
@EXECUTOR
@WORKERS
@DASK
@JSON
@guard
def resume(run_id: str, plan: bool, store: str | None, executor: str | None,
           workers: int | None, dask_address: str | None, as_json: bool) -> None:
    """Continue a run: keep its successes, retry lost tasks, reset failed ones.

    \b
    Example:
      pipeline resume 20261129-194138-3fa9c2 --plan
    """
    if plan:
        rows = api.plan_resume(run_id, store=store)
        if as_json:
            out(dumps([{"key": k, "action": a, "why": w} for k, a, w in rows]))
            return
        counts: dict[str, int] = {}
        for _, action, _ in rows:
            counts[action] = counts.get(action, 0) + 1
        out(f"resume plan for {run_id}: " + ", ".join(
            f"{n} {a}" for a, n in sorted(counts.items())))
        for key, action, why in rows:
            if action != "reuse":
                out(f"  {action:<6} {key}: {why}")
        return
    api.check_executor(executor)
    prior = api.open_ledger(store).get_run(run_id, upstream=False)
    if not as_json:
        out(f"run {run_id}  resuming")

    def start(cancel: threading.Event, progress: Any) -> Run:
        return api.resume(run_id, store=store, executor=executor, workers=workers,
                          progress=progress, cancel_event=cancel, dask_address=dask_address)

    _finish(_drive(start, as_json, prior.counts()), as_json)


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
    api.cancel(run_id, store=store)
    out(f"cancel requested for {run_id}; its driver stops within a second")


@main.command()
@click.argument("run_id")
@STORE
@JSON
@guard
def status(run_id: str, store: str | None, as_json: bool) -> None:
    """Show a run's state and each task's state, attempts, time and error.

    \b
    Example:
      pipeline status 20261129-194138-3fa9c2 --json
    """
    st = api.open_ledger(store)
    view = st.get_run(run_id, upstream=False)
    if as_json:
        out(dumps(view.as_json()))
        return
    summary(view, all_rows=True)
    notes = st.notices(run_id)
    for n in notes[:20]:
        out(f"notice: {n['task_key']} attempt {n['attempt']}: {n['kind']}: {n['message']}")


@main.command()
@STORE
@JSON
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True,
              envvar="LEDGERFLOW_LIMIT", help="How many runs [env LEDGERFLOW_LIMIT].")
@guard
def runs(store: str | None, as_json: bool, limit: int) -> None:
    """List the newest runs.

    \b
    Example:
      pipeline runs --limit 5
    """
    views = api.runs(store=store, limit=limit)
    if as_json:
        out(dumps([v.summary_json() for v in views]))
        return
    if not views:
        out("no runs yet")
        return
    for v in views:
        alive = "  (driver gone: resumable)" if v.active and v.driver_alive is False else ""
        out(f"{v.run_id}  {v.pipeline:<20} {v.state:<10} {counts_text(v.counts())}{alive}")


@main.command()
@click.argument("run_id")
@click.option("--task", "task_key", metavar="KEY", envvar="LEDGERFLOW_TASK",
              help="Only this task, with its ancestry [env LEDGERFLOW_TASK].")
@STORE
@JSON
@guard
def lineage(run_id: str, task_key: str | None, store: str | None, as_json: bool) -> None:
    """Show where results came from: inputs, outputs, hashes, code versions.

    \b
    Example:
      pipeline lineage RUN_ID --task 'embed[doc-1.md]'
    """
    st = api.open_ledger(store)
    rows = st.lineage(run_id)
    if task_key is not None:
        view = st.get_run(run_id)
        if task_key not in view.tasks:
            raise InputError(f"run {run_id} has no task {task_key!r}",
                             hint=f"list its tasks with: pipeline status {run_id}")
        rows = lineage_of(view, rows, task_key)
    if as_json:
        out(dumps(rows))
        return
    for r in rows:
        attrs = " ".join(f"{k}={v}" for k, v in (r.get("attrs") or {}).items())
        out(f"{r['task_key']}  attempt {r['attempt']}  {r['direction']:<6} {r['uri']}  "
            f"hash={(r['content_hash'] or '-')[:12]}  code={r['code_version']}  {attrs}")


@main.command()
@click.argument("target")
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE")
@click.option("--format", "fmt", type=click.Choice(["text", "mermaid", "dot"]), default="text",
              show_default=True, envvar="LEDGERFLOW_FORMAT",
              help="Output format [env LEDGERFLOW_FORMAT].")
@guard
def graph(target: str, params: tuple[str, ...], fmt: str) -> None:
    """Print a pipeline's graph without running it (validates it too).

    \b
    Example:
      pipeline graph flows.py --format mermaid
    """
    pipe = api.load_target(target)
    g = pipe.build(**convert_params(pipe, params))
    out({"text": g.to_text, "mermaid": g.to_mermaid, "dot": g.to_dot}[fmt]())


@main.command()
@guard
def plugins() -> None:
    """List registered plugins and what they provide.

    \b
    Example:
      pipeline plugins
    """
    from ..plugins import plugin_table
    for name, where, provides in plugin_table():
        out(f"{name:<16} {', '.join(provides) or '-':<32} {where}")
