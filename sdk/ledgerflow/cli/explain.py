"""The ``explain`` command: why each task of a run ran or was reused (:mod:`ledgerflow.explain`)."""

from __future__ import annotations

import click

from .guard import guard
from .options import JSON, STORE, main
from .render import dumps, out

#: Tasks listed per reason before the rest of the group is summed up.
GROUP_ROWS = 8

_TITLES = {"cached": "reused (cache hit)", "verify": "ran: verify rejected the cached result",
           "new": "ran: new task", "failed_before": "ran: did not succeed before",
           "code": "ran: code changed", "input": "ran: an input changed",
           "argument": "ran: an argument changed", "not_reused": "ran: same fingerprint, not reused",
           "not_run": "did not run"}


@main.command()
@click.argument("run_id")
@click.option("--task", "task_key", metavar="KEY", envvar="LEDGERFLOW_TASK",
              help="Only this task, in full [env LEDGERFLOW_TASK].")
@click.option("--against", metavar="RUN_ID",
              help="Compare with this run (default: the latest earlier run of the same "
              "pipeline and target).")
@click.option("--all", "all_rows", is_flag=True,
              help=f"List every task of each reason (default: {GROUP_ROWS} per reason).")
@STORE
@JSON
@guard
def explain(run_id: str, task_key: str | None, against: str | None, all_rows: bool,
            store: str | None, as_json: bool) -> None:
    """Say why each task ran or was reused: cache hit, code, input, argument, verify...

    \b
    Example:
      pipeline explain RUN_ID
      pipeline explain RUN_ID --task 'embed[notes/a.md]' --against OTHER_RUN_ID
    """
    from .. import control as api
    from ..explain import explain_run
    st = api.open_ledger(store)
    res = explain_run(st, run_id, task_key=task_key, against=against)
    if as_json:
        out(dumps(res.as_json()))
        return
    head = f"run {res.run_id}  pipeline {res.pipeline}  compared with " \
        + (res.against or "no earlier run")
    trig = res.trigger
    if trig:
        what = trig.get("kind", "?")
        paths = trig.get("paths") or []
        head += f"  trigger {what}" + (f" ({len(paths)} path(s): {', '.join(paths[:3])}"
                                       + (" ..." if len(paths) > 3 else "") + ")"
                                       if paths else "")
    out(head)
    if task_key is not None:
        t = res.tasks[0]
        out(f"{t.key}  ({t.task}, {t.state}, {t.attempts} attempt(s))")
        out(f"  {t.detail}")
        if len(t.reasons) > 1:
            out("  also: " + ", ".join(t.reasons[1:]))
        return
    groups = res.groups()
    cached = groups.pop("cached", [])
    for reason, tasks in groups.items():
        out(f"{_TITLES[reason]}: {len(tasks)}")
        shown = tasks if all_rows else tasks[:GROUP_ROWS]
        for t in shown:
            out(f"  {t.key}  {t.detail}")
        if len(tasks) > len(shown):
            names: dict[str, int] = {}
            for t in tasks[len(shown):]:
                names[t.task] = names.get(t.task, 0) + 1
            out(f"  ... and {len(tasks) - len(shown)} more ("
                + ", ".join(f"{n} {name}" for name, n in names.items()) + "; --all lists them)")
    if cached:        # the reused tasks last, summed by the run they came from
        out(f"{_TITLES['cached']}: {len(cached)}")
        if all_rows or len(cached) <= GROUP_ROWS:
            for t in cached:
                out(f"  {t.key}  {t.detail}")
            return
        runs: dict[str, dict[str, int]] = {}
        for t in cached:
            names = runs.setdefault(t.source_run or "?", {})
            names[t.task] = names.get(t.task, 0) + 1
        for src, names in runs.items():
            out(f"  from {src}: " + ", ".join(f"{n} {name}" for name, n in names.items())
                + " (--all lists them)")
