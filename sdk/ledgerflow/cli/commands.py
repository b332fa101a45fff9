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
from ..errors import InputError, PluginError, TaskNotFoundError
from ..launch import Run, read_run
from ..pipeline import Pipeline
from ..states import RunState
from ..store import reading
from ..views import RunView, counts_text, iso, lineage_of
from .guard import guard
from .params import convert_params
from .render import ROW_LIMIT, STATUS_ROWS, dumps, out, progress_for, summary

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
LOGS = click.option("--logs", is_flag=True, envvar="LEDGERFLOW_LOGS",
                    help="Echo what tasks print and log to stderr, prefixed with the task key "
                    "(always kept per attempt: pipeline logs) [env LEDGERFLOW_LOGS].")
WAIT = click.option("--wait-approvals", is_flag=True, envvar="LEDGERFLOW_WAIT_APPROVALS",
                    help="Keep driving while approvals are pending (else the run stops "
                    "'waiting', exit code 3) [env LEDGERFLOW_WAIT_APPROVALS].")
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
    """Drive a run in this process with Ctrl-C as cancel and a progress display.

    With ``--json`` stdout holds the document alone: anything else written
    meanwhile (a pipeline body's prints, echoed logs) goes to stderr.
    """
    if as_json:
        real, sys.stdout = sys.stdout, sys.stderr
        try:
            return _driven(start, True, initial)
        finally:
            sys.stdout = real
    return _driven(start, False, initial)


def _driven(start: Callable[[threading.Event, Any], Run], as_json: bool,
            initial: dict[str, int] | None) -> Run:
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


def _one_line(row: dict[str, Any]) -> str:
    import json
    return json.dumps(row)


def _finish(run: Run, as_json: bool) -> None:
    summarize = getattr(run.store, "summarize", None)
    view = None if as_json or summarize is None else summarize(run.run_id,
                                                                min_tasks=ROW_LIMIT)
    if view is None:
        view = read_run(run.store, run.run_id, upstream=False)
    waiting = view.state == RunState.WAITING
    if as_json:
        out(dumps(view.as_json()))
    else:
        summary(view)
        if waiting:
            _pending_lines(run.approvals(pending_only=True), view.run_id)
        out(f"details: pipeline status {view.run_id}")
        if view.state != RunState.SUCCEEDED:
            out(f"resume:  pipeline resume {view.run_id}"
                + ("   (once the approvals are decided)" if waiting else ""))
    sys.exit(0 if view.state == RunState.SUCCEEDED else 3 if waiting else 1)


def _pending_lines(rows: list[dict[str, Any]], run_id: str) -> None:
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
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A pipeline parameter, converted by its type annotation.")
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
    if not as_json:
        out(f"run {run_id}  pipeline {pipe.name}  ({len(graph)} steps)")

    def start(cancel: threading.Event, progress: Any) -> Run:
        return api.start(pipe, (), values, store=store, executor=executor, workers=workers,
                         fail_fast=fail_fast or None, run_id=run_id,
                         target=api.abs_target(target, pipe.name), progress=progress,
                         cancel_event=cancel, dask_address=dask_address, graph=graph,
                         logs=logs or None, wait_approvals=wait_approvals or None)

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
    api.open_ledger(store).get_run(run_id, tasks=False)     # the run exists: say so
    if not as_json:
        out(f"run {run_id}  resuming")

    def start(cancel: threading.Event, progress: Any) -> Run:
        return api.resume(run_id, store=store, executor=executor, workers=workers,
                          progress=progress, cancel_event=cancel, dask_address=dask_address,
                          logs=logs or None, wait_approvals=wait_approvals or None)

    _finish(_drive(start, as_json, None), as_json)


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
@click.option("--task", "task_key", metavar="KEY", envvar="LEDGERFLOW_TASK",
              help="One task: every attempt with outcome, duration, error and traceback.")
@click.option("--all", "all_rows", is_flag=True,
              help="One row per task even for big runs (default: by task name above 500).")
@STORE
@JSON
@guard
def status(run_id: str, task_key: str | None, all_rows: bool, store: str | None,
           as_json: bool) -> None:
    """Show a run's state, its root cause, and each task's state, attempts, time and error.

    \b
    Example:
      pipeline status 20261129-194138-3fa9c2 --json
      pipeline status 20261129-194138-3fa9c2 --task 'embed[a.md]'
    """
    st = api.open_ledger(store)
    with reading(st):
        _status(st, run_id, task_key, all_rows, as_json)


def _status(st: Any, run_id: str, task_key: str | None, all_rows: bool,
            as_json: bool) -> None:
    view = None
    summarize = getattr(st, "summarize", None)
    if summarize is not None and task_key is None and not as_json and not all_rows:
        view = summarize(run_id, min_tasks=STATUS_ROWS)     # a big run: summed in the store
    if view is None:
        view = read_run(st, run_id, upstream=False)
    if task_key is not None:
        _task_status(st, view, task_key, as_json)
        return
    if as_json:
        out(dumps(view.as_json()))
        return
    summary(view, all_rows=True, every_row=all_rows)
    decided = st.approvals(run_id)
    _pending_lines([r for r in decided if r["state"] == "pending" and r["current"]], run_id)
    for r in decided:
        if r["state"] != "pending":
            out(f"approval: {r['task_key']} {r['action']} {r['state']} by {r['decided_by']}"
                + (f": {r['reason']}" if r["reason"] else "") + f"  (digest {r['digest'][:12]})")
    if view.damage:
        out(f"damaged: {view.damage}")
        out("  (the records after the damage are not applied; pipeline doctor explains it)")
    notes = st.notices(run_id)
    for n in notes[:20]:
        out(f"notice: {n['task_key']} attempt {n['attempt']}: {n['kind']}: {n['message']}")


def _task_status(st: Any, view: RunView, task_key: str, as_json: bool) -> None:
    row = view.tasks.get(task_key)
    if row is None:
        raise TaskNotFoundError(view.run_id, task_key, view.tasks)
    attempts = st.attempts(view.run_id, task_key)
    if as_json:
        out(dumps({**row.as_json(), "attempts": attempts}))
        return
    cached = f" (cached from {row.cached_from})" if row.cached_from else ""
    out(f"task {row.key} ({row.task_name}): {row.state}{cached}, "
        f"{row.attempts} attempt(s)")
    if row.error:
        out(f"  error: {row.error}")
    for a in attempts:
        took = (f"{a['ended_at'] - a['started_at']:.3f}s"
                if a["started_at"] is not None and a["ended_at"] is not None else "-")
        err = f"  {a['error_type']}: {a['error_message']}" if a["outcome"] != "ok" else ""
        out(f"  attempt {a['attempt']}: {a['outcome']:<9} {took:>9}{err}")
        if a.get("traceback"):
            for line in a["traceback"].rstrip().splitlines():
                out(f"      {line}")
    out(f"output: pipeline logs {view.run_id} --task '{row.key}'")


@main.command()
@click.argument("run_id")
@click.option("--task", "task_key", metavar="KEY", envvar="LEDGERFLOW_TASK",
              help="Only this task [env LEDGERFLOW_TASK].")
@click.option("--attempt", type=click.IntRange(1), metavar="N",
              help="Only this attempt (with --task).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing attempts' output as they end, until the run ends.")
@STORE
@JSON
@guard
def logs(run_id: str, task_key: str | None, attempt: int | None, follow: bool,
         store: str | None, as_json: bool) -> None:
    """Print what tasks wrote (stdout, stderr, logging), per attempt.

    \b
    Example:
      pipeline logs 20261129-194138-3fa9c2 --task 'embed[a.md]' --attempt 2
    """
    import time as _time
    st = api.open_ledger(store)
    view = st.get_run(run_id, tasks=task_key is not None)
    if task_key is not None and task_key not in view.tasks:
        raise TaskNotFoundError(run_id, task_key, view.tasks)
    shown = 0
    while True:
        rows = st.logs(run_id, task_key, attempt)
        fresh, shown = rows[shown:], len(rows)
        if as_json and not follow:
            out(dumps(rows))
            return
        for r in fresh:
            if as_json:
                out(_one_line(r))       # --follow --json: one JSON object per line
                continue
            cut = f", {r['dropped']} characters dropped" if r["dropped"] else ""
            out(f"=== {r['task_key']} attempt {r['attempt']}{cut}")
            text = r["text"]
            out(text if text.endswith("\n") else text + "\n", nl=False)
        if not follow or not st.get_run(run_id, tasks=False).active:
            if not rows and not as_json:
                out("no output recorded" + (f" for {task_key}" if task_key else ""))
            return
        _time.sleep(0.5)


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
@click.option("--export", "export", nargs=2, metavar="FORMAT FILE", default=None,
              help="Write the run's lineage in FORMAT (e.g. openlineage: one event per "
              "line) to FILE ('-': standard output) instead of showing it.")
@STORE
@JSON
@guard
def lineage(run_id: str, task_key: str | None, export: tuple[str, str] | None,
            store: str | None, as_json: bool) -> None:
    """Show where results came from: inputs, outputs, hashes, code versions.

    \b
    Example:
      pipeline lineage RUN_ID --task 'embed[doc-1.md]'
      pipeline lineage RUN_ID --export openlineage events.jsonl
    """
    st = api.open_ledger(store)
    if export is not None:
        _export_lineage(st, run_id, export[0], export[1], task_key, as_json)
        return
    rows = st.lineage(run_id)
    if task_key is not None:
        view = st.get_run(run_id)
        if task_key not in view.tasks:
            raise TaskNotFoundError(run_id, task_key, view.tasks)
        rows = lineage_of(view, rows, task_key)
    if as_json:
        out(dumps(rows))
        return
    for r in rows:
        attrs = " ".join(f"{k}={v}" for k, v in (r.get("attrs") or {}).items())
        out(f"{r['task_key']}  attempt {r['attempt']}  {r['direction']:<6} {r['uri']}  "
            f"hash={(r['content_hash'] or '-')[:12]}  code={r['code_version']}  {attrs}")


def _export_lineage(st: Any, run_id: str, fmt: str, path: str, task_key: str | None,
                    as_json: bool) -> None:
    from ..plugins import get_plugin_manager
    if task_key is not None:
        raise InputError("--export writes a whole run; it does not take --task",
                         hint=f"pipeline lineage {run_id} --export {fmt} {path}")
    hook = get_plugin_manager().hook
    formats = sorted({f for fs in hook.ledgerflow_lineage_formats() for f in fs})
    if fmt not in formats:
        raise InputError(f"no lineage export format {fmt!r}; installed: "
                         + (", ".join(formats) or "none"),
                         hint="pass one of them, e.g. --export openlineage FILE")
    st.get_run(run_id, tasks=False)         # RunNotFoundError before anything is written
    written = hook.ledgerflow_export_lineage(format=fmt, run_id=run_id, store=st, path=path)
    if written is None:
        raise PluginError(f"the plugin offering lineage format {fmt!r} exported nothing",
                          hint="check its ledgerflow_export_lineage hook")
    if path == "-":
        return
    if as_json:
        out(dumps({"run_id": run_id, "format": fmt, "path": path, "written": written}))
    else:
        out(f"wrote {written} {fmt} item(s) of run {run_id} to {path}")


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


@main.command()
@STORE
@guard
def fold(store: str | None) -> None:
    """Fold the journals that stopped drivers left into the ledger's tables now.

    Any command that writes (run, resume, cancel, repair) does it too; use this
    to bring the tables current for SQL users.

    \b
    Example:
      pipeline fold --store .ledgerflow/ledger.duckdb
    """
    st = api.open_ledger(store)
    done = st.fold() if hasattr(st, "fold") else []
    out(f"folded {len(done)} run(s)" + (": " + ", ".join(done) if done else ""))


@main.command()
@STORE
@JSON
@guard
def doctor(store: str | None, as_json: bool) -> None:
    """Check a ledger (file, journals, folds, leases, result files) in plain words.

    Exit 0 when nothing is wrong, 2 when something is (with the fix).

    \b
    Example:
      pipeline doctor --store .ledgerflow/ledger.duckdb
    """
    found = api.open_ledger(store).doctor()
    problems = [f for f in found if f["problem"]]
    if as_json:
        out(dumps(found))
    else:
        for f in found:
            out(("PROBLEM " if f["problem"] else "ok      ") + f["what"])
            if f["fix"]:
                out(f"        fix: {f['fix']}")
        out(f"{len(problems)} problem(s) found" if problems else "no problems found")
    if problems:
        sys.exit(2)


@main.command()
@STORE
@guard
def repair(store: str | None) -> None:
    """Rebuild the ledger's tables from its journals into a new file and swap it in.

    The old file is kept beside it (LEDGER.broken-TIME). Refused while a run is
    being driven.

    \b
    Example:
      pipeline repair --store .ledgerflow/ledger.duckdb
    """
    kept, notes = api.open_ledger(store).repair()
    if kept:
        out(f"rebuilt the tables from the journals; the old file is kept at {kept}")
    for note in notes:
        out(f"  {note}")
    out("next: pipeline doctor  |  pipeline runs")


@main.command()
@click.argument("run_id", required=False)
@STORE
@JSON
@guard
def approvals(run_id: str | None, store: str | None, as_json: bool) -> None:
    """List approval requests waiting for a decision (of one run, or of every run).

    \b
    Example:
      pipeline approvals 20261129-194138-3fa9c2 --json
    """
    rows = api.approvals(run_id, store=store)
    if as_json:
        out(dumps([{"run_id": r["run_id"], "task_key": r["task_key"], "action": r["action"],
                    "summary": r["summary"], "digest": r["digest"], "inputs": r["inputs"],
                    "requested_at": iso(r["requested_at"]), "deadline": iso(r["deadline"]),
                    "on_timeout": r["on_timeout"], "approvers": r["approvers"],
                    "note": r["note"]} for r in rows]))
        return
    if not rows:
        out("no approvals waiting")
        return
    for rid in dict.fromkeys(r["run_id"] for r in rows):
        out(f"run {rid}:")
        for r in [x for x in rows if x["run_id"] == rid][:50]:
            deadline = f"  deadline {iso(r['deadline'])} ({r['on_timeout']})" \
                if r["deadline"] else ""
            out(f"  {r['task_key']}  {r['action']}: {r['summary']}  digest "
                f"{r['digest'][:12]}  requested {iso(r['requested_at'])}{deadline}")
        n = sum(1 for x in rows if x["run_id"] == rid)
        if n > 50:
            out(f"  ... and {n - 50} more (pipeline approvals {rid} --json lists them all)")


def _decided(doc: dict[str, Any], run_id: str, and_resume: bool, store: str | None) -> None:
    out(f"{doc['task_key']}: {doc['decision']} by {doc['decided_by']} "
        f"(digest {doc['digest'][:12]})")
    view = api.open_ledger(store).get_run(run_id, tasks=False)
    if and_resume and view.state != RunState.SUCCEEDED and not view.driver_alive:
        out(f"resuming {run_id}")
        _finish(_drive(lambda cancel, progress: api.resume(
            run_id, store=store, progress=progress, cancel_event=cancel), False), False)
    elif view.driver_alive:
        out("its driver picks the decision up within a second")
    else:
        out(f"continue it with: pipeline resume {run_id}")


@main.command()
@click.argument("run_id")
@click.argument("task_key")
@click.option("--digest", required=True, metavar="PREFIX",
              help="The digest of what you approve (at least 6 characters), as listed by "
              "pipeline approvals.")
@click.option("--reason", default="", help="Why (recorded with the decision).")
@click.option("--as", "by", metavar="NAME", help="Who decides (default: the OS user).")
@click.option("--resume", "and_resume", is_flag=True,
              help="Then resume the run here if no driver is alive.")
@STORE
@guard
def approve(run_id: str, task_key: str, digest: str, reason: str, by: str | None,
            and_resume: bool, store: str | None) -> None:
    """Approve a request waiting for a decision (bound to its digest).

    \b
    Example:
      pipeline approve RUN_ID publish --digest 3fa9c2d1e0b4 --resume
    """
    doc = api.approve(run_id, task_key, digest=digest, reason=reason, by=by, store=store)
    _decided(doc, run_id, and_resume, store)


@main.command()
@click.argument("run_id")
@click.argument("task_key")
@click.option("--reason", required=True, help="Why (recorded; the task fails 'rejected').")
@click.option("--digest", metavar="PREFIX", help="Check the request's digest too.")
@click.option("--as", "by", metavar="NAME", help="Who decides (default: the OS user).")
@click.option("--resume", "and_resume", is_flag=True,
              help="Then resume the run here if no driver is alive.")
@STORE
@guard
def reject(run_id: str, task_key: str, reason: str, digest: str | None, by: str | None,
           and_resume: bool, store: str | None) -> None:
    """Reject a request waiting for a decision: the task fails with reason 'rejected'.

    \b
    Example:
      pipeline reject RUN_ID publish --reason "wrong index"
    """
    doc = api.reject(run_id, task_key, reason=reason, digest=digest, by=by, store=store)
    _decided(doc, run_id, and_resume, store)


@main.command()
@click.argument("run_id")
@STORE
@JSON
@guard
def usage(run_id: str, store: str | None, as_json: bool) -> None:
    """Sum a run's model calls: tokens, cost and calls per task, model and key.

    \b
    Example:
      pipeline usage 20261129-194138-3fa9c2 --json
    """
    doc = api.get_run(run_id, store=store).usage()
    if as_json:
        out(dumps(doc))
        return
    t = doc["totals"]
    out(f"run {run_id}: {t['model_calls']} model call(s), {t['tokens']} tokens "
        f"({t['input_tokens']} in, {t['output_tokens']} out), cost {t['cost']:.6g}, "
        f"{t['tool_calls']} tool call(s)"
        + (f", {t['replayed']} replayed (not billed)" if t["replayed"] else ""))
    for group in ("task", "model", "key"):
        rows = doc[f"by_{group}"]
        if rows:
            out(f"by {group}:")
            for r in rows:
                out(f"  {r[group]:<40} {r['model_calls']:>5} calls {r['tokens']:>9} tokens "
                    f"cost {r['cost']:.6g}")
