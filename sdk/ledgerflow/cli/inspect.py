"""The reading commands: ``status``, ``result``, ``logs``, ``runs``, ``lineage``, ``graph``,
``usage``.

Each reads a run through :mod:`ledgerflow.control` (the :class:`~ledgerflow.launch.Run`
handle and its views) and renders it; none writes to the ledger.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .. import control as api
from ..errors import InputError, PluginError, TaskNotFoundError
from ..views import RunView, counts_text, lineage_of
from .drive import pending_lines
from .guard import guard
from .options import JSON, PARAMS, STORE, main
from .params import convert_params
from .render import STATUS_ROWS, attempts_json, dumps, out, run_dumps, summary, task_lines


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
    run = api.get_run(run_id, store=store, check=False)
    with api.reads(run):
        _status(run, task_key, all_rows, as_json)


def _status(run: api.Run, task_key: str | None, all_rows: bool, as_json: bool) -> None:
    big = task_key is None and not as_json and not all_rows
    # (the upstream keys order the table: ledgerflow.views.RunView.in_order)
    view = api.view(run, summed_above=STATUS_ROWS if big else None, upstream=not as_json)
    if task_key is not None:
        _task_status(run, view, task_key, as_json)
        return
    if as_json:
        out(run_dumps(view))
        return
    summary(view, all_rows=True, every_row=all_rows)
    decided = api.decisions(run)
    pending_lines([r for r in decided if r["state"] == "pending" and r["current"]],
                  run.run_id)
    for r in decided:
        if r["state"] != "pending":
            out(f"approval: {r['task_key']} {r['action']} {r['state']} by {r['decided_by']}"
                + (f": {r['reason']}" if r["reason"] else "") + f"  (digest {r['digest'][:12]})")
    if view.damage:
        out(f"damaged: {view.damage}")
        out("  (the records after the damage are not applied; pipeline doctor explains it)")
    for n in run.notices()[:20]:    # a run's own notice (a repair's, a fold's) names no task
        who = f"{n['task_key']} attempt {n['attempt']}: " if n["task_key"] else ""
        out(f"notice: {who}{n['kind']}: {n['message']}")


def _task_status(run: api.Run, view: RunView, task_key: str, as_json: bool) -> None:
    row = view.tasks.get(task_key)
    if row is None:
        raise TaskNotFoundError(view.run_id, task_key, view.tasks)
    attempts = run.attempts(task_key)
    if as_json:
        out(dumps({**row.as_json(), "attempts": attempts_json(attempts)}))
        return
    for line in task_lines(row, attempts):
        out(line)
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
    run = api.get_run(run_id, store=store, check=task_key is None)
    if task_key is not None:
        view = api.view(run)
        if task_key not in view.tasks:
            raise TaskNotFoundError(run_id, task_key, view.tasks)
    shown = 0
    while True:
        rows = run.logs(task_key, attempt)
        fresh, shown = rows[shown:], len(rows)
        if as_json and not follow:
            out(dumps(rows))
            return
        for r in fresh:
            if as_json:
                out(json.dumps(r))       # --follow --json: one JSON object per line
                continue
            cut = f", {r['dropped']} characters dropped" if r["dropped"] else ""
            out(f"=== {r['task_key']} attempt {r['attempt']}{cut}")
            text = r["text"]
            out(text if text.endswith("\n") else text + "\n", nl=False)
        if not follow or not api.head(run).active:
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
        out(f"no runs yet in {api.ledger_location(store)}")
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
    run = api.get_run(run_id, store=store, check=False)
    if export is not None:
        _export_lineage(run, export[0], export[1], task_key, as_json)
        return
    rows = run.lineage()
    if task_key is not None:
        view = api.view(run, upstream=True)
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


def _export_lineage(run: api.Run, fmt: str, path: str, task_key: str | None,
                    as_json: bool) -> None:
    if task_key is not None:
        raise InputError("--export writes a whole run; it does not take --task",
                         hint=f"pipeline lineage {run.run_id} --export {fmt} {path}")
    formats = api.lineage_formats()
    if fmt not in formats:
        raise InputError(f"no lineage export format {fmt!r}; installed: "
                         + (", ".join(formats) or "none"),
                         hint="pass one of them, e.g. --export openlineage FILE")
    written = api.export_lineage(run, fmt, path)
    if written is None:
        raise PluginError(f"the plugin offering lineage format {fmt!r} exported nothing",
                          hint="check its ledgerflow_export_lineage hook")
    if path == "-":
        return
    if as_json:
        out(dumps({"run_id": run.run_id, "format": fmt, "path": path, "written": written}))
    else:
        out(f"wrote {written} {fmt} item(s) of run {run.run_id} to {path}")


@main.command()
@click.argument("target")
@PARAMS
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
        rows: list[dict[str, Any]] = doc[f"by_{group}"]
        if rows:
            out(f"by {group}:")
            for r in rows:
                out(f"  {r[group]:<40} {r['model_calls']:>5} calls {r['tokens']:>9} tokens "
                    f"cost {r['cost']:.6g}")


@main.command()
@click.argument("run_id")
@click.option("--task", "task_key", metavar="KEY", envvar="LEDGERFLOW_TASK",
              help="One task's result instead of the pipeline's.")
@STORE
@JSON
@guard
def result(run_id: str, task_key: str | None, store: str | None, as_json: bool) -> None:
    """Print a run's result: what its pipeline returned (or one task's value).

    Text as it is, other values as Python shows them; --json as JSON (values
    JSON cannot hold as their text).

    \b
    Example:
      pipeline result 20261129-194138-3fa9c2 --json
      pipeline result 20261129-194138-3fa9c2 --task 'embed[a.md]'
    """
    value = api.get_run(run_id, store=store).result(task_key)
    if as_json:
        out(dumps(value))
    elif isinstance(value, str):
        out(value)
    else:
        import pprint
        out(pprint.pformat(value, width=100, sort_dicts=False))
