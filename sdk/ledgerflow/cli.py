"""The ``pipeline`` command: a thin click layer over :mod:`ledgerflow.run`.

Exit codes: 0 the run succeeded; 1 it failed or was cancelled; 2 bad usage
or bad input (with ``Error:`` and ``Hint:`` lines, no traceback unless
``--debug``); 70 an internal error (a bug: the traceback is printed).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from .errors import InputError, ParameterBindError, PipelineError
from .pipeline import Pipeline
from .run import Run
from .store import RunView, _iso

# ``ledgerflow.run`` is also the name of a function re-exported by the package.
api = importlib.import_module("ledgerflow.run")

STORE = click.option("--store", envvar="LEDGERFLOW_STORE", metavar="PATH",
                     help="Ledger file [env LEDGERFLOW_STORE; default .ledgerflow/ledger.duckdb].")
JSON = click.option("--json", "as_json", is_flag=True, envvar="LEDGERFLOW_JSON",
                    help="Print JSON instead of a table [env LEDGERFLOW_JSON].")


def _fail(exc: PipelineError, debug: bool) -> None:
    if debug:
        traceback.print_exception(exc)
    click.echo(f"Error: {exc}", err=True)
    if exc.hint:
        click.echo(f"Hint: {exc.hint}", err=True)
    sys.exit(exc.exit_code)


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn PipelineErrors into Error/Hint lines and exit codes."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(click.get_current_context().find_root().params.get("debug"))
        try:
            return fn(*args, **kwargs)
        except PipelineError as exc:
            _fail(exc, debug)
        except (click.exceptions.Exit, click.ClickException, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # a bug: say so, with the traceback
            traceback.print_exception(exc)
            click.echo(f"Error: internal error: {type(exc).__name__}: {exc}", err=True)
            click.echo("Hint: this is a bug in ledgerflow; please report it with the "
                       "traceback above", err=True)
            sys.exit(70)
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="LEDGERFLOW_DEBUG",
              help="Show tracebacks for errors.")
@click.version_option(package_name="ledgerflow")
def main(debug: bool) -> None:
    """Run, inspect, cancel and resume ledgerflow pipelines.

    \b
    Example:
      pipeline run flows.py -p n=10
      pipeline status RUN_ID
      pipeline resume RUN_ID
    """


# -- parameters ----------------------------------------------------------------------------

def _convert(pipe: Pipeline[..., Any], raw: Sequence[str]) -> dict[str, Any]:
    params = pipe.signature.parameters
    out: dict[str, Any] = {}
    for item in raw:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise InputError(f"parameter {item!r} is not key=value",
                             hint="pass parameters as -p name=value")
        if key not in params:
            raise ParameterBindError(
                f"pipeline {pipe.name!r} has no parameter {key!r}; it takes: "
                + (", ".join(params) or "no parameters"),
                hint=f"pass one of: {', '.join(params)}" if params else "drop the -p options")
        out[key] = _typed(pipe, key, params[key], text)
    return out


def _typed(pipe: Pipeline[..., Any], key: str, param: inspect.Parameter, text: str) -> Any:
    ann = param.annotation
    if isinstance(ann, str):
        ann = {"int": int, "float": float, "bool": bool, "str": str, "Path": Path,
               "list": list, "dict": dict}.get(ann.split("|")[0].strip().split("[")[0], str)
    elif ann is inspect.Parameter.empty:
        ann = type(param.default) if param.default not in (inspect.Parameter.empty, None) else str
    origin = getattr(ann, "__origin__", None) or ann
    try:
        if origin is bool:
            low = text.lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(text)
            return low in ("1", "true", "yes", "on")
        if origin in (int, float):
            return origin(text)
        if origin in (list, dict, tuple):
            value = json.loads(text)
            if not isinstance(value, list if origin is tuple else origin):
                raise ValueError(text)
            return value
        if origin is Path:
            return text
        return text
    except ValueError:
        name = getattr(origin, "__name__", str(origin))
        raise ParameterBindError(
            f"parameter {key!r} of {pipe.name!r} must be {name}, given: {text!r}",
            hint=f"pass -p {key}=<{name}>") from None


# -- progress ------------------------------------------------------------------------------

class _Lines:
    """Plain progress lines for pipes and logs."""

    def __init__(self, total_hint: int) -> None:
        self.counts: dict[str, int] = {}
        self.verbose = total_hint <= 200
        self.last = time.monotonic()

    def __call__(self, key: str, old: str, new: str) -> None:
        self.counts[new] = self.counts.get(new, 0) + 1
        if old:
            self.counts[old] = self.counts.get(old, 0) - 1
        if new in ("failed", "upstream_failed", "cancelled") or (
                self.verbose and new == "succeeded"):
            click.echo(f"  {new:<15} {key}")
        elif time.monotonic() - self.last > 5:
            self.last = time.monotonic()
            done = self.counts.get("succeeded", 0)
            click.echo(f"  ... {done} succeeded, {self.counts.get('running', 0)} running")

    def close(self) -> None:
        return None


class _Bar:
    """A live rich progress bar on a terminal."""

    def __init__(self, total_hint: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[detail]}"),
                                 TimeElapsedColumn(), transient=False)
        self.task = self.progress.add_task("tasks", total=total_hint or None, detail="")
        self.counts: dict[str, int] = {}
        self.progress.start()
        self.last = 0.0

    def __call__(self, key: str, old: str, new: str) -> None:
        c = self.counts
        c[new] = c.get(new, 0) + 1
        if old:
            c[old] = c.get(old, 0) - 1
        now = time.monotonic()
        if now - self.last < 0.1 and new != "failed":
            return
        self.last = now
        total = sum(v for v in c.values() if v > 0)
        ended = sum(c.get(s, 0) for s in ("succeeded", "failed", "cancelled", "upstream_failed"))
        self.progress.update(self.task, total=total, completed=ended,
                             detail=f"running {c.get('running', 0)}  failed {c.get('failed', 0)}")

    def close(self) -> None:
        c = self.counts
        total = sum(v for v in c.values() if v > 0)
        ended = sum(c.get(s, 0) for s in ("succeeded", "failed", "cancelled", "upstream_failed"))
        self.progress.update(self.task, total=total, completed=ended,
                             detail=f"failed {c.get('failed', 0)}")
        self.progress.stop()


def _drive_cli(start: Callable[[threading.Event, Any], Run], as_json: bool,
               total_hint: int) -> Run:
    cancel = threading.Event()
    presses = {"n": 0}

    def on_sigint(signum: int, frame: Any) -> None:
        presses["n"] += 1
        if presses["n"] == 1:
            cancel.set()
            click.echo("\ncancelling: waiting for running tasks to stop "
                       "(Ctrl-C again to exit at once; the run stays resumable)", err=True)
        else:
            os._exit(130)

    old = signal.signal(signal.SIGINT, on_sigint)
    progress: Any = None
    if not as_json:
        progress = _Bar(total_hint) if sys.stdout.isatty() else _Lines(total_hint)
    try:
        return start(cancel, progress)
    finally:
        signal.signal(signal.SIGINT, old)
        if progress is not None:
            progress.close()


def _json(doc: object, size: int) -> str:
    # indented JSON goes through the pure-Python encoder: ~20 µs a task on big runs
    return json.dumps(doc, indent=2 if size <= 1000 else None)


def _finish(run: Run, as_json: bool) -> None:
    view = run.store.get_run(run.run_id, upstream=False)
    if as_json:
        click.echo(_json(view.as_json(), len(view.tasks)))
    else:
        _summary(view)
        click.echo(f"details: pipeline status {view.run_id}")
        if view.state != "succeeded":
            click.echo(f"resume:  pipeline resume {view.run_id}")
    sys.exit(0 if view.state == "succeeded" else 1)


# -- commands ------------------------------------------------------------------------------

EXECUTOR = click.option("--executor", envvar="LEDGERFLOW_EXECUTOR", metavar="NAME",
                        help="inline, threads (default), processes, mock, dask "
                        "[env LEDGERFLOW_EXECUTOR].")
WORKERS = click.option("--workers", envvar="LEDGERFLOW_WORKERS", type=click.IntRange(1),
                       help="Tasks run at once [env LEDGERFLOW_WORKERS; default 4].")
DASK = click.option("--dask-address", envvar="LEDGERFLOW_DASK_ADDRESS", metavar="URL",
                    help="Dask scheduler, e.g. tcp://127.0.0.1:8786 [env LEDGERFLOW_DASK_ADDRESS].")


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
@_guard
def run(target: str, params: tuple[str, ...], store: str | None, executor: str | None,
        workers: int | None, dask_address: str | None, fail_fast: bool, as_json: bool) -> None:
    """Run a pipeline: FILE.py[:PIPELINE], a module:PIPELINE, or a .json/.toml spec.

    \b
    Example:
      pipeline run recipes/doc_index/pipeline.py -p source=docs/ --workers 2
    """
    pipe = api.load_target(target)
    values = _convert(pipe, params)
    graph = pipe.build(**values)            # validate before anything is written
    api.check_executor(executor)
    run_id = api.new_run_id()
    if not as_json:
        click.echo(f"run {run_id}  pipeline {pipe.name}  ({len(graph)} steps)")

    def start(cancel: threading.Event, progress: Any) -> Run:
        started: Run = api.start(pipe, (), values, store=store, executor=executor,
                                 workers=workers, fail_fast=fail_fast or None, run_id=run_id,
                                 target=api._abs_target(target), progress=progress,
                                 cancel_event=cancel, dask_address=dask_address)
        return started

    _finish(_drive_cli(start, as_json, len(graph)), as_json)


@main.command()
@click.argument("run_id")
@click.option("--plan", is_flag=True, envvar="LEDGERFLOW_PLAN",
              help="Show what would be reused and re-run; run nothing [env LEDGERFLOW_PLAN].")
@STORE
@EXECUTOR
@WORKERS
@DASK
@JSON
@_guard
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
            click.echo(json.dumps([{"key": k, "action": a, "why": w} for k, a, w in rows],
                                  indent=2))
            return
        counts: dict[str, int] = {}
        for _, action, _ in rows:
            counts[action] = counts.get(action, 0) + 1
        click.echo(f"resume plan for {run_id}: " + ", ".join(
            f"{n} {a}" for a, n in sorted(counts.items())))
        for key, action, why in rows:
            if action != "reuse":
                click.echo(f"  {action:<6} {key}: {why}")
        return
    api.check_executor(executor)
    st = api._store_for(api._settings(store, None, None, None))
    total = len(st.get_run(run_id, upstream=False).tasks)
    if not as_json:
        click.echo(f"run {run_id}  resuming")

    def start(cancel: threading.Event, progress: Any) -> Run:
        started: Run = api.resume(run_id, store=store, executor=executor, workers=workers,
                                  progress=progress, cancel_event=cancel,
                                  dask_address=dask_address)
        return started

    _finish(_drive_cli(start, as_json, total), as_json)


@main.command()
@click.argument("run_id")
@STORE
@_guard
def cancel(run_id: str, store: str | None) -> None:
    """Ask a running run to cancel (from any process).

    \b
    Example:
      pipeline cancel 20261129-194138-3fa9c2
    """
    api.cancel(run_id, store=store)
    click.echo(f"cancel requested for {run_id}; its driver stops within a second")


@main.command()
@click.argument("run_id")
@STORE
@JSON
@_guard
def status(run_id: str, store: str | None, as_json: bool) -> None:
    """Show a run's state and each task's state, attempts, time and error.

    \b
    Example:
      pipeline status 20261129-194138-3fa9c2 --json
    """
    st = api._store_for(api._settings(store, None, None, None))
    view = st.get_run(run_id, upstream=False)
    if as_json:
        click.echo(_json(view.as_json(), len(view.tasks)))
        return
    _summary(view, all_rows=True)
    notes = st.notices(run_id)
    for n in notes[:20]:
        click.echo(f"notice: {n['task_key']} attempt {n['attempt']}: {n['kind']}: {n['message']}")


def _summary(view: RunView, all_rows: bool = False) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    console = Console(width=max(100, min(160, Console().width)), soft_wrap=False)
    rows = list(view.tasks.values())
    colours = {"succeeded": "green", "failed": "red", "upstream_failed": "red",
               "cancelled": "yellow", "running": "cyan", "cancelling": "yellow"}
    table = Table(title=escape(f"run {view.run_id} ({view.pipeline}): {view.state}"),
                  title_justify="left")
    if len(rows) <= (500 if all_rows else 50):
        for col in ("task", "state", "attempts", "duration", "error"):
            table.add_column(col, overflow="fold")
        for r in rows:
            dur = f"{r.ended_at - r.started_at:.3f}s" if r.started_at and r.ended_at else ""
            state = r.state + (" (cached)" if r.cached_from else "")
            # task keys hold [item] suffixes: escape them, or rich reads them as markup
            table.add_row(escape(r.key), f"[{colours.get(r.state, 'white')}]{state}[/]",
                          str(r.attempts), dur, escape((r.error or "")[:120]))
    else:   # many tasks: one line per task name, then the ones that did not succeed
        for col in ("task", "tasks", "states", "cached", "busy time", "first error"):
            table.add_column(col, overflow="fold")
        by_name: dict[str, list[Any]] = {}
        for r in rows:
            by_name.setdefault(r.task_name or r.key, []).append(r)
        for name, group in by_name.items():
            states: dict[str, int] = {}
            for r in group:
                states[r.state] = states.get(r.state, 0) + 1
            busy = sum(r.ended_at - r.started_at for r in group if r.started_at and r.ended_at)
            err = next((f"{r.key}: {r.error}" for r in group if r.error
                        and r.state != "succeeded"), "")
            table.add_row(escape(name), str(len(group)), ", ".join(
                f"[{colours.get(s, 'white')}]{n} {s}[/]" for s, n in sorted(states.items())),
                str(sum(1 for r in group if r.cached_from)), f"{busy:.2f}s", escape(err[:120]))
    console.print(table)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(view.counts().items()))
    console.print(f"tasks: {counts}")
    if view.state in ("running", "cancelling") and view.driver_alive is False:
        console.print(f"driver is gone: resume with  pipeline resume {view.run_id}")


@main.command()
@STORE
@JSON
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True,
              envvar="LEDGERFLOW_LIMIT", help="How many runs [env LEDGERFLOW_LIMIT].")
@_guard
def runs(store: str | None, as_json: bool, limit: int) -> None:
    """List the newest runs.

    \b
    Example:
      pipeline runs --limit 5
    """
    views = api.runs(store=store, limit=limit)
    if as_json:
        click.echo(json.dumps([{"run_id": v.run_id, "pipeline": v.pipeline, "state": v.state,
                                "created_at": _iso(v.created_at), "ended_at": _iso(v.ended_at),
                                "counts": v.counts(), "driver_alive": v.driver_alive}
                               for v in views], indent=2))
        return
    if not views:
        click.echo("no runs yet")
        return
    for v in views:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(v.counts().items()))
        alive = "  (driver gone: resumable)" if v.state == "running" and v.driver_alive is False \
            else ""
        click.echo(f"{v.run_id}  {v.pipeline:<20} {v.state:<10} {counts}{alive}")


@main.command()
@click.argument("run_id")
@click.option("--task", "task_key", metavar="KEY", envvar="LEDGERFLOW_TASK",
              help="Only this task, with its ancestry [env LEDGERFLOW_TASK].")
@STORE
@JSON
@_guard
def lineage(run_id: str, task_key: str | None, store: str | None, as_json: bool) -> None:
    """Show where results came from: inputs, outputs, hashes, code versions.

    \b
    Example:
      pipeline lineage RUN_ID --task 'embed[doc-1.md]'
    """
    st = api._store_for(api._settings(store, None, None, None))
    view = st.get_run(run_id)
    if task_key is not None and task_key not in view.tasks:
        raise InputError(f"run {run_id} has no task {task_key!r}",
                         hint=f"list its tasks with: pipeline status {run_id}")
    keys = [task_key] if task_key else list(view.tasks)
    if task_key:   # follow the upstream chain
        seen, stack = set(keys), list(keys)
        while stack:
            for up in view.tasks[stack.pop()].upstream:
                if up in view.tasks and up not in seen:
                    seen.add(up)
                    keys.append(up)
                    stack.append(up)
    rows = [r for k in keys for r in st.lineage(run_id, k)]
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    for r in rows:
        attrs = " ".join(f"{k}={v}" for k, v in (r.get("attrs") or {}).items())
        click.echo(f"{r['task_key']}  attempt {r['attempt']}  {r['direction']:<6} {r['uri']}  "
                   f"hash={(r['content_hash'] or '-')[:12]}  code={r['code_version']}  {attrs}")


@main.command()
@click.argument("target")
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE")
@click.option("--format", "fmt", type=click.Choice(["text", "mermaid", "dot"]), default="text",
              show_default=True, envvar="LEDGERFLOW_FORMAT",
              help="Output format [env LEDGERFLOW_FORMAT].")
@_guard
def graph(target: str, params: tuple[str, ...], fmt: str) -> None:
    """Print a pipeline's graph without running it (validates it too).

    \b
    Example:
      pipeline graph flows.py --format mermaid
    """
    pipe = api.load_target(target)
    g = pipe.build(**_convert(pipe, params))
    click.echo({"text": g.to_text, "mermaid": g.to_mermaid, "dot": g.to_dot}[fmt]())


@main.command()
@_guard
def plugins() -> None:
    """List registered plugins and what they provide.

    \b
    Example:
      pipeline plugins
    """
    from .plugins import plugin_table
    for name, where, provides in plugin_table():
        click.echo(f"{name:<16} {', '.join(provides) or '-':<32} {where}")


def _add_plugin_commands() -> None:
    try:
        from .plugins import get_plugin_manager
        get_plugin_manager().hook.ledgerflow_add_cli_commands(group=main)
    except PipelineError:
        pass


_add_plugin_commands()
