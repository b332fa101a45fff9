"""``pipeline draft "REQUEST" --tasks MODULE... -o draft.toml``: a model writes a spec."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ledgerflow.cli.commands import JSON, STORE
from ledgerflow.cli.guard import guard
from ledgerflow.cli.render import dumps, out
from ledgerflow.errors import InputError


@click.command("draft")
@click.argument("request")
@click.option("--tasks", "sources", multiple=True, required=True, metavar="MODULE",
              help="A module, package or .py file whose @task functions the draft may use "
              "(repeatable).")
@click.option("-o", "--output", required=True, metavar="FILE",
              help="Where to write the draft (.toml, or .json).")
@click.option("--model", default="mock", show_default=True, envvar="LEDGERFLOW_DRAFT_MODEL",
              help="A model provider: local, mock (script in LEDGERFLOW_MOCK_MODEL), "
              "openai:MODEL... [env LEDGERFLOW_DRAFT_MODEL].")
@click.option("--policy", "policy_path", metavar="POLICY.toml", envvar="LEDGERFLOW_POLICY",
              help="Hold the draft to this policy too (and the model to its models) "
              "[env LEDGERFLOW_POLICY].")
@click.option("--repairs", type=click.IntRange(0, 10), default=2, show_default=True,
              help="How many times the validator's problems are sent back for a repair.")
@click.option("--max-tokens", type=click.IntRange(16), default=None,
              help="Output tokens per model answer (default 900).")
@STORE
@JSON
@guard
def draft_command(request: str, sources: tuple[str, ...], output: str, model: str,
                  policy_path: str | None, repairs: int, max_tokens: int | None,
                  store: str | None, as_json: bool) -> None:
    """Draft a spec from a request in plain words; validate and repair it; write it.

    The drafting is a run of its own (its model calls are in the ledger:
    pipeline usage RUN_ID). The draft is marked machine-written with its
    digest: pipeline run refuses it until pipeline approve-draft approves that
    digest. Exit 0 with a valid draft, 2 when problems remain after the
    repairs (the draft is written anyway, to fix by hand), 1 if the drafting
    run failed.

    \b
    Example:
      pipeline draft "index the markdown files in docs/ into docs.duckdb" \\
          --tasks recipes/doc_index/pipeline.py --model local -o draft.toml
    """
    from ledgerflow.specs.catalogue import find_tasks
    from ledgerflow.specs.policy import load_policy
    from ledgerflow.states import RunState

    from . import draft
    if not output.endswith((".toml", ".json")):
        raise InputError(f"a draft is a .toml or .json spec, given -o {output}",
                         hint="e.g. -o draft.toml")
    if policy_path:
        pol = load_policy(policy_path)
        if not pol.allows_model(model):
            raise InputError(f"policy {policy_path} does not allow the model {model!r}",
                             hint="use one of its models: " + ", ".join(pol.models or ()))
    base = str(Path(output).resolve().parent)
    cat = find_tasks(sources, base=base)
    if not len(cat):
        raise InputError("no @task functions found in " + ", ".join(sources),
                         hint="pass modules that define tasks: --tasks mypkg.steps")
    real = sys.stdout
    if as_json:
        sys.stdout = sys.stderr
    try:
        run = draft(request, tasks=sources, output=output, model=model, policy=policy_path,
                    repairs=repairs, store=store, max_tokens=max_tokens)
    finally:
        sys.stdout = real
    view = run.status()
    if view.state != RunState.SUCCEEDED:
        bad = view.root_causes() or list(view.tasks.values())
        first = bad[0] if bad else None
        why = f"{first.key}: {first.error}" if first is not None else view.state
        if as_json:
            out(dumps({"run_id": run.run_id, "state": view.state, "error": why}))
        else:
            out(f"run {run.run_id}: drafting {view.state}: {why}", err=True)
            out(f"details: pipeline status {run.run_id} --task draft_spec", err=True)
        sys.exit(1)
    res = run.result()
    if as_json:
        out(dumps({"run_id": run.run_id, **res}))
        sys.exit(0 if res["valid"] else 2)
    for r in res["rounds"]:
        n, unused = len(r["problems"]), len(r.get("unused") or [])
        state = "valid" if not n else f"{n} problem(s)"
        if unused:
            state += f", {unused} value(s) of the request unused"
        if (n or unused) and r is not res["rounds"][-1]:
            state += " -> sent back for a repair"
        out(f"round {r['round']}: {state}  ({r['seconds']:.1f}s)")
    if res.get("stopped"):
        out(f"repairs stopped: {res['stopped']}")
    if res["path"] is None:
        out("the model gave no spec; nothing was written", err=True)
        sys.exit(2)
    short = res["digest"][:12]
    out(f"wrote {output}: {res['steps']} step(s), machine-written, digest {short} "
        f"(run {run.run_id}; its model calls: pipeline usage {run.run_id})")
    for note in res.get("notes") or []:
        out(f"  note {note['path']}: {note['message']}")
    for u in res.get("unused") or []:
        out(f"  warning: {u['message']}: check the draft does what you asked")
    if not res["valid"]:
        out(f"{len(res['problems'])} problem(s) remain after {repairs} repair(s):")
        for p in res["problems"]:
            out(f"  {p['path'] or '(spec)'}  [{p['code']}] {p['message']}")
        out(f"fix them by hand, then: pipeline validate {output}")
        sys.exit(2)
    out(f"review it:  pipeline validate {output} --plan")
    out(f"approve it: pipeline approve-draft {output} --digest {short}")
    out(f"then:       pipeline run {output}")
