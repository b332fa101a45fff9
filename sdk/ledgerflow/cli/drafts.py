"""The spec commands: ``spec-schema``, ``validate`` and ``approve-draft``.

``pipeline draft`` itself (a model writes the spec) comes from the
``ledgerflow_drafts`` plugin; these three need no model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import InputError
from .commands import JSON, STORE, main
from .guard import guard
from .render import dumps, out


@main.command("spec-schema")
@click.option("--tasks", "sources", multiple=True, metavar="MODULE_OR_PACKAGE",
              help="A module, package or .py file whose @task functions specs may name "
              "(repeatable; the plugins' tasks are always included).")
@click.option("-o", "--output", metavar="FILE",
              help="Write the schema to FILE (default: standard output). File modules are "
              "named relative to FILE's folder.")
@guard
def spec_schema(sources: tuple[str, ...], output: str | None) -> None:
    """Print the JSON Schema of a spec over the tasks found (for editors and models).

    \b
    Example:
      pipeline spec-schema --tasks mypkg.steps --tasks recipes/doc_index/pipeline.py \\
          -o spec.schema.json
    """
    from ..specs.catalogue import find_tasks
    from ..specs.schema import spec_schema as build
    base = str(Path(output).resolve().parent) if output else os.getcwd()
    cat = find_tasks(sources, base=base)
    for w in cat.warnings:
        out(f"Warning: {w}", err=True)
    text = dumps(build(cat))
    if output is None:
        out(text)
        return
    Path(output).write_text(text + "\n")
    out(f"wrote the spec schema of {len(cat)} task(s) to {output}")


def _report(path: str, policy_path: str | None) -> tuple[Any, Any, Any]:
    """(report, document, draft header) of the spec file at ``path``."""
    from ..specs import drafts
    from ..specs.check import Report, check, check_draft
    from ..specs.document import read_document
    from ..specs.policy import load_policy
    from ..specs.problems import Problem
    policy = load_policy(policy_path) if policy_path else None
    p = Path(path)
    if not p.is_file():
        raise InputError(f"spec not found: {path}", hint="pass the path of a .toml or .json spec")
    try:
        doc, text = read_document(p)
    except InputError as exc:
        if not str(exc).startswith(f"spec {path} is not valid"):
            raise
        rep = Report()
        rep.problems.append(Problem(path="", code="spec.syntax", message=str(exc),
                                    hint=exc.hint or "fix the file's syntax"))
        return rep, None, None
    folder = str(p.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    header = drafts.parse_header(text, doc)
    if header is not None:      # read as data: nothing the draft names is imported
        return check_draft(doc, header, folder=folder, policy=policy, cwd=os.getcwd()), doc, \
            header
    return check(doc, folder=folder, policy=policy, cwd=os.getcwd()), doc, None


@main.command()
@click.argument("spec")
@click.option("--policy", "policy_path", metavar="POLICY.toml", envvar="LEDGERFLOW_POLICY",
              help="Also check what this policy allows [env LEDGERFLOW_POLICY].")
@click.option("--plan", is_flag=True, help="Also show what would run, in order, with the gates.")
@click.option("--store", metavar="PATH",
              help="For a machine-written draft, say whether this ledger has its approval.")
@JSON
@guard
def validate(spec: str, policy_path: str | None, plan: bool, store: str | None,
             as_json: bool) -> None:
    """Check a .toml/.json spec without running it: every problem, with where it is.

    Exit 0 when it is valid, 2 when it has problems. Steps that will wait for
    approval are notes, not problems.

    \b
    Example:
      pipeline validate draft.toml --policy POLICY.toml --plan
    """
    from ..specs import drafts
    report, doc, header = _report(spec, policy_path)
    digest = drafts.spec_digest(doc) if isinstance(doc, dict) else None
    approved = None
    if header is not None and store is not None and digest is not None:
        from .. import control as api
        approved = drafts.approval(api.open_ledger(store), header, digest)
    if as_json:
        doc_out: dict[str, Any] = {"spec": spec, **report.as_json(), "digest": digest,
                                   "machine_written": header is not None}
        if header is not None:
            doc_out["draft"] = {"run": header.run, "model": header.model,
                                "request": header.request, "drafted_digest": header.digest}
            if store is not None:
                doc_out["draft"]["approved"] = approved
        if plan:
            doc_out["plan"] = report.plan()
        out(dumps(doc_out))
    else:
        _print_report(spec, report, header, digest, approved, store is not None, plan)
    if not report.valid:
        sys.exit(2)


def _print_report(spec: str, report: Any, header: Any, digest: str | None,
                  approved: dict[str, Any] | None, checked: bool, plan: bool) -> None:
    n, notes = len(report.problems), len(report.notes)
    if n:
        out(f"{spec}: {n} problem(s)" + (f", {notes} note(s)" if notes else ""))
    else:
        gates = sum(1 for r in report.plan() if r["gate"])
        out(f"{spec}: valid ({len(report.steps)} step(s)"
            + (f", {gates} approval gate(s)" if gates else "") + ")")
    for p in report.problems:
        out(f"  error {p.path or '(file)'}  [{p.code}]")
        out(f"        {p.message}")
        if p.hint:
            out(f"        hint: {p.hint}")
    for p in report.notes:
        out(f"  note  {p.path}  [{p.code}]")
        out(f"        {p.message}")
    if header is not None and digest is not None:
        edited = header.digest and header.digest != digest
        out(f"machine-written draft (run {header.run}, model {header.model or '?'}); digest "
            f"{digest[:12]}" + ("  (edited since it was drafted)" if edited else ""))
        if approved is not None:
            out(f"  approved by {approved['decided_by']} (digest {digest[:12]})")
        elif report.valid:
            out(("  not approved in this ledger; " if checked else "  ")
                + f"it runs once approved: pipeline approve-draft {spec} --digest "
                f"{digest[:12]}")
    if plan:
        _print_plan(report, header is not None and approved is None)


def _print_plan(report: Any, needs_approval: bool) -> None:
    rows = report.plan()
    if not rows:
        out("plan: none (the steps cannot be ordered: see the cycle above)" if report.cycles
            else "plan: none")
        return
    out("plan, in order" + ("" if report.valid else " (once the problems are fixed)") + ":")
    if needs_approval:
        out("  0. (the draft's digest must be approved before anything runs)")
    width = max(len(r["step"]) for r in rows)
    for i, r in enumerate(rows, 1):
        parts = [r["task"]]
        if r["map"]:
            parts.append(f"one per item of {r['map']}")
        ups = [u for u in r["waits_for"] if u != r["map"]]
        if ups:
            parts.append("after " + ", ".join(ups))
        if r["gate"]:
            who = f" by {', '.join(r['approvers'])}" if r["approvers"] else ""
            parts.append(f"GATE: waits for approval{who}")
        out(f"  {i}. {r['step']:<{width}}  " + "; ".join(parts))


@main.command("approve-draft")
@click.argument("spec")
@click.option("--digest", required=True, metavar="PREFIX",
              help="The digest you reviewed (at least 6 characters), as pipeline validate or "
              "the draft's header shows it.")
@click.option("--reason", default="", help="Why (recorded with the approval).")
@click.option("--as", "by", metavar="NAME", help="Who approves (default: the OS user).")
@click.option("--policy", "policy_path", metavar="POLICY.toml", envvar="LEDGERFLOW_POLICY",
              help="Refuse unless the draft also fits this policy [env LEDGERFLOW_POLICY].")
@STORE
@JSON
@guard
def approve_draft(spec: str, digest: str, reason: str, by: str | None,
                  policy_path: str | None, store: str | None, as_json: bool) -> None:
    """Approve a machine-written draft's current digest, so pipeline run runs it.

    The approval is recorded in the ledger, on the run that drafted it, with
    who and when. An edited draft has a new digest and needs a new approval.

    \b
    Example:
      pipeline approve-draft draft.toml --digest 3fa9c2d1e0b4
    """
    from .. import control as api
    from ..identity import decider
    from ..specs import drafts
    from ..views import iso
    report, doc, header = _report(spec, policy_path)
    if header is None:
        if doc is None:
            raise InputError(f"{spec} cannot be read as a spec: {report.problems[0].message}",
                             hint=f"fix it, then: pipeline validate {spec}")
        raise InputError(f"{spec} is not a machine-written draft (it has no draft header), "
                         "so it needs no approval", hint=f"run it: pipeline run {spec}")
    if not report.valid:
        raise InputError(f"{spec} has {len(report.problems)} problem(s) (first: "
                         f"{report.problems[0]}); a draft with problems cannot be approved",
                         hint=f"see them all: pipeline validate {spec}")
    current = drafts.spec_digest(doc)
    decision, new = drafts.approve(api.open_ledger(store), spec, header, current, digest,
                                   by=decider(by), reason=reason)
    if as_json:
        out(dumps({"spec": spec, "digest": current, "run": header.run, "new": new,
                   "approved_by": decision["decided_by"],
                   "approved_at": iso(decision["decided_at"]), "reason": decision["reason"]}))
        return
    verb = "approved" if new else "was already approved"
    out(f"{spec} {verb}: digest {current[:12]} by {decision['decided_by']} at "
        f"{iso(decision['decided_at'])} (recorded on run {header.run})")
    out(f"run it: pipeline run {spec}")
