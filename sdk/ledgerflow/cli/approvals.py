"""The approval commands: ``approvals`` (what waits), ``approve`` and ``reject``.

A decision is recorded through :mod:`ledgerflow.control`; with ``--resume``
the run is then driven here if no driver is alive. ``approve --arguments JSON``
edits a tool call's arguments (:mod:`ledgerflow.edits`); ``approvals RUN`` also
lists the requests of the run approved with edited arguments.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .. import control as api
from ..errors import InputError
from ..states import RunState
from ..views import iso
from .drive import drive, finish
from .guard import guard
from .options import JSON, STORE, main
from .render import dumps, out


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
    edited = api.edited(run_id, store=store) if run_id else []
    if as_json:
        out(dumps([{"run_id": r["run_id"], "task_key": r["task_key"], "action": r["action"],
                    "summary": r["summary"], "digest": r["digest"],
                    "arguments": r["arguments"], "inputs": r["inputs"],
                    "requested_at": iso(r["requested_at"]), "deadline": iso(r["deadline"]),
                    "on_timeout": r["on_timeout"], "approvers": r["approvers"],
                    "note": r["note"], "changed": r["changed"], "previous": r["previous"],
                    "state": "pending", "editable": r["editable"], "edit": None}
                   for r in rows] + [{**_edit_doc(r), "state": r["state"]} for r in edited]))
        return
    if not rows:
        out("no approvals waiting")
    for rid in dict.fromkeys(r["run_id"] for r in rows):
        out(f"run {rid}:")
        mine = [x for x in rows if x["run_id"] == rid][:50]
        for i, r in enumerate(mine):       # many: the first in full, one line each after
            if i == 0 or len(mine) <= 10:
                for line in request_lines(r):
                    out("  " + line)
            else:
                out(f"  {r['task_key']}  {r['action']}: {r['summary']}  digest "
                    f"{r['digest'][:12]}")
        n = sum(1 for x in rows if x["run_id"] == rid)
        if n > 50:
            out(f"  ... and {n - 50} more (pipeline approvals {rid} --json lists them all)")
    if edited:
        out(f"run {run_id}: decided with edited arguments:")
    for r in edited:
        out(f"  {r['task_key']}  {r['action']}  digest {r['digest'][:12]}  {r['state']} by "
            f"{r['edit']['by']} {iso(r['decided_at'])}")
        out(f"    original: {json.dumps(r['edit']['original'], sort_keys=True)}")
        out(f"    edited:   {json.dumps(r['edit']['arguments'], sort_keys=True)}")


def _edit_doc(r: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": r["run_id"], "task_key": r["task_key"], "action": r["action"],
            "summary": r["summary"], "digest": r["digest"], "edit": r["edit"],
            "decided_at": iso(r["decided_at"])}


def request_lines(r: dict[str, Any]) -> list[str]:
    """One waiting request as an approver reads it: what, with which values, who, until
    when, what changed since the last request of this gate, and how to decide."""
    lines = [f"{r['task_key']}  {r['action']}  digest {r['digest'][:12]}  requested "
             f"{iso(r['requested_at'])}"]
    if r.get("note"):
        lines.append(f"  note: {r['note']}")
    for name, value in (r.get("arguments") or {}).items():
        lines.append(f"  {name} = {value}")
    if not r.get("arguments"):
        lines.append(f"  {r['summary']}")
    for up, h in (r.get("inputs") or {}).items():
        lines.append(f"  input {up}: result {h[:12]}")
    lines.append("  approvers: " + (", ".join(r["approvers"]) if r.get("approvers")
                                    else "anyone"))
    if r.get("deadline"):
        verdict = "expired" if r["on_timeout"] == "fail" else "rejected"
        lines.append(f"  deadline: {iso(r['deadline'])} (then {verdict})")
    prev = r.get("previous")
    if prev is not None:
        changed = r.get("changed") or []
        what = "; ".join(f"{c['field']}: {c['before']} -> {c['after']}" for c in changed) \
            or "no argument changed (the code or an input did)"
        lines.append(f"  changed since request {prev['digest'][:12]} ({prev['state']}): "
                     f"{what}")
    lines.append(f"  decide: pipeline approve {r['run_id']} '{r['task_key']}' --digest "
                 f"{r['digest'][:12]}   (or reject ... --reason \"...\")")
    if r.get("editable"):
        lines.append("  a tool call: approve with other arguments by adding "
                     "--arguments '{...}' (all of them, as JSON)")
    return lines


def parse_arguments(text: str | None) -> dict[str, Any] | None:
    """``--arguments``: a JSON object (None when not given)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InputError(f"--arguments is not JSON: {exc}",
                         hint="""pass a JSON object of all the call's arguments, e.g. """
                         """--arguments '{"text": "two"}'""") from None
    if not isinstance(value, dict):
        raise InputError(f"--arguments must be a JSON object of the call's arguments, given "
                         f"{type(value).__name__} {text[:60]}",
                         hint="""e.g. --arguments '{"text": "two"}'""")
    return value


def _decided(doc: dict[str, Any], run_id: str, and_resume: bool, store: str | None) -> None:
    edit = "" if doc.get("arguments") is None else \
        f" with edited arguments {json.dumps(doc['arguments'], sort_keys=True)}"
    line = (f"{doc['task_key']}: {doc['decision']} by {doc['decided_by']}{edit} "
            f"(digest {doc['digest'][:12]})")
    handle = api.get_run(run_id, store=store, check=False)
    view = api.head(handle)
    if and_resume and view.state != RunState.SUCCEEDED and not view.driver_alive:
        out(line + "; resuming it here")
        finish(drive(lambda cancel, progress: api.resume(
            run_id, store=handle.store, progress=progress, cancel_event=cancel),
            False, run_id, f"resuming {run_id}"), False)
    else:       # what happens next: a live driver takes it, or it waits for a resume
        out(f"{line}; {doc['next']}")


#: The options approve and reject share.
_AS = click.option("--as", "by", metavar="NAME",
                   help="Decide as NAME (default: your OS user's approver name); only a "
                   "name the approvers mapping gives your OS user.")
_RESUME = click.option("--resume", "and_resume", is_flag=True,
                       help="Then resume the run here if no driver is alive.")


@main.command()
@click.argument("run_id")
@click.argument("task_key")
@click.option("--digest", required=True, metavar="PREFIX",
              help="The digest of what you approve (at least 6 characters), as listed by "
              "pipeline approvals.")
@click.option("--reason", default="", help="Why (recorded with the decision).")
@click.option("--arguments", "arguments", metavar="JSON",
              help="A tool call's request only: run the tool with these arguments "
              "instead (a JSON object of all of them; checked against the tool's schema).")
@_AS
@_RESUME
@STORE
@guard
def approve(run_id: str, task_key: str, digest: str, reason: str, arguments: str | None,
            by: str | None, and_resume: bool, store: str | None) -> None:
    """Approve a request waiting for a decision (bound to its digest).

    \b
    Example:
      pipeline approve RUN_ID publish --digest 3fa9c2d1e0b4 --resume
      pipeline approve RUN_ID worker --digest 3fa9c2d1e0b4 --arguments '{"text": "two"}'
    """
    doc = api.approve(run_id, task_key, digest=digest, reason=reason, by=by, store=store,
                      arguments=parse_arguments(arguments))
    _decided(doc, run_id, and_resume, store)


@main.command()
@click.argument("run_id")
@click.argument("task_key")
@click.option("--reason", required=True, help="Why (recorded; the task fails 'rejected').")
@click.option("--digest", metavar="PREFIX", help="Check the request's digest too.")
@_AS
@_RESUME
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
