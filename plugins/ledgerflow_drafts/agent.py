"""The drafting agent as a ledgerflow pipeline: ask a model for a spec, validate, repair, save.

``drafting`` has two steps. ``draft_spec`` asks the model for a spec by a
call of one tool, ``write_spec``, whose parameters are the drafting schema
(:mod:`ledgerflow_drafts.schema`; the ``local`` provider decodes under it,
other providers get it as the tool's schema), checks the answer with
:func:`ledgerflow.specs.check.check` (and the policy), and, while problems remain
and repairs are left, sends the validator's problem objects back as the
tool's result and asks again. Every model call is recorded in the ledger
(``context().record_model_call``: tokens, cost, digests; ``pipeline usage``),
every check as a tool call ``validate_spec``, and each model answer as a step
(``context().step``), so a retry or a resume replays the answers it has
instead of asking again. ``save_draft`` writes the file with the draft header
(:mod:`ledgerflow.specs.drafts`) and records it as the run's output (lineage, with
the digest as its content hash).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Final

from ledgerflow import Pipeline, context, task
from ledgerflow.approval import DRAFTING
from ledgerflow.keys import digest as content_digest
from ledgerflow.specs import drafts as draft_file
from ledgerflow.specs.catalogue import Catalogue, find_tasks
from ledgerflow.specs.check import check
from ledgerflow.specs.policy import load_policy

from .schema import chain, drafting_schema

TOOL: Final = "write_spec"
#: Output tokens allowed per model answer (a spec of 8 steps is about 300).
MAX_TOKENS: Final = 900

_ABOUT = (
    'You write the pipeline for the request as JSON: {"tasks": {STEP: {...}}}. Each step '
    "runs one of the functions below and is named after it. In a step:\n"
    '- "args": {ARGUMENT: VALUE}: the function\'s arguments; copy paths, file names and '
    "words from the request exactly.\n"
    '- "map": STEP: run once for each item of that step\'s list result (the item is the '
    "first argument).\n"
    '- "inputs": {ARGUMENT: STEP}: pass that step\'s result as the argument.\n'
    '- "after": [STEP]: run after that step.\n'
    "Use the steps the request needs.")


def catalogue_text(cat: Catalogue) -> str:
    """The functions a draft may use, one line each, and the chain they form (for the prompt)."""
    short = cat.short_names()
    lines = []
    for ref, info in cat.tasks.items():
        sig = info.signature.replace(ref.rpartition(":")[2] + "(", short[ref] + "(", 1)
        doc = re.sub(r"``?", "", info.doc)
        lines.append(f"- {sig}" + (f": {doc}" if doc else "")
                     + (" (waits for a person's approval)" if info.gated else ""))
    text = "Functions:\n" + "\n".join(lines)
    run = chain(cat)
    if run:
        text += "\nThese functions fit together in this order: " + " -> ".join(run) + "."
    return text


def complete_spec(found: dict[str, Any], cat: Catalogue, name: str) -> dict[str, Any]:
    """A model's spec with what the drafting schema leaves implied filled in: a step
    named after a task runs that task; the spec's name."""
    by_short = {s: ref for ref, s in cat.short_names().items()}
    doc = dict(found)
    tasks = doc.get("tasks")
    if isinstance(tasks, dict):
        filled = {}
        for key, step in tasks.items():
            if isinstance(step, dict) and "task" not in step and key in by_short:
                step = {"task": by_short[key], **step}
            filled[key] = step
        doc["tasks"] = filled
    doc.setdefault("name", name)
    return {"name": doc.pop("name"), **doc}


def tool_spec(cat: Catalogue) -> dict[str, Any]:
    """The one tool the model calls: its parameters are the drafting schema."""
    return {"name": TOOL, "description": "write the pipeline spec for the request",
            "parameters": drafting_schema(cat)}


def spec_of(response: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The spec in a model's answer (a ``write_spec`` call, or JSON text), or why none."""
    for call in response.get("tool_calls") or ():
        if call.get("name") == TOOL and isinstance(call.get("arguments"), dict):
            return dict(call["arguments"]), ""
    text = str(response.get("text") or "").strip()
    fenced = re.search(r"```(?:json|toml)?\s*(.*?)```", text, re.S)
    if fenced:
        text = fenced.group(1).strip()
    if text:
        try:
            doc = json.loads(text)
        except ValueError:
            pass
        else:
            if isinstance(doc, dict):
                return doc, ""
    return None, ("the answer had no spec: call write_spec with the whole spec as its "
                  "arguments")


_PATHLIKE = re.compile(r"(?<![\w/.~-])(~?[\w.-]*/[\w./-]*|[\w-]+\.[A-Za-z]\w{1,7})(?![\w/])")
_QUOTED = re.compile(r"[\"'\u201c\u2018]([^\"'\u201d\u2019]{1,200})[\"'\u201d\u2019]")


def mentioned(request: str) -> list[str]:
    """Values a request names literally: quoted text, paths and file names.

    Example:
        >>> mentioned("index docs/ into docs.duckdb, then search it for 'patents'")
        ['patents', 'docs/', 'docs.duckdb']
    """
    found = [m.group(1) for m in _QUOTED.finditer(request)]
    rest = _QUOTED.sub(" ", request)
    found += [m.group(1).rstrip(".,;:") for m in _PATHLIKE.finditer(rest)]
    return list(dict.fromkeys(v for v in found if v.strip()))


def _norm(value: str) -> str:
    v = value.strip()
    while v.startswith("./"):
        v = v[2:]
    return v.rstrip("/") or v


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def coverage(request: str, doc: dict[str, Any]) -> list[dict[str, str]]:
    """What the request names literally that no step's arguments use (draft feedback:
    a model that left a path or a quoted value out, or put it nowhere)."""
    found = doc.get("tasks")
    tasks: dict[str, Any] = found if isinstance(found, dict) else {}
    used = [_norm(s) for step in tasks.values() if isinstance(step, dict)
            for s in _strings(step.get("args") or {})]
    out = []
    for value in mentioned(request):
        v = _norm(value)
        if not any(v == u or (len(v) > 2 and v in u) for u in used):
            out.append({"path": "tasks", "code": "draft.unused_value",
                        "message": f"the request names {value!r}, but no step's args use it",
                        "hint": "give it to the argument it is meant for"})
    return out


def _record(ctx: Any, seq: int, model: Any, req: Any, resp: Any, replayed: bool) -> None:
    pricing = getattr(model, "pricing", None)
    cost = pricing.cost(resp.usage.input_tokens, resp.usage.output_tokens) if pricing else 0.0
    ctx.record_model_call(
        seq=seq, provider=resp.provider or getattr(model, "provider", ""),
        model=resp.model or getattr(model, "model", ""),
        key_alias=getattr(model, "key_alias", None) or "",
        request_hash=req.digest(), response_hash=resp.response_digest,
        input_tokens=resp.usage.input_tokens, output_tokens=resp.usage.output_tokens,
        cost=0.0 if replayed else cost, latency=resp.latency_s,
        finish_reason=resp.finish_reason, tool_calls=[c["name"] for c in resp.tool_calls],
        replayed=replayed)


def _record_failed(ctx: Any, seq: int, model: Any, req: Any, exc: Any, latency: float) -> None:
    """Record a model call that failed (its tokens were spent all the same)."""
    usage = getattr(exc, "usage", None)
    inp, out = (usage.input_tokens, usage.output_tokens) if usage is not None else (0, 0)
    pricing = getattr(model, "pricing", None)
    ctx.record_model_call(
        seq=seq, provider=getattr(model, "provider", ""), model=getattr(model, "model", ""),
        key_alias=getattr(model, "key_alias", None) or "", request_hash=req.digest(),
        response_hash="", input_tokens=inp, output_tokens=out,
        cost=pricing.cost(inp, out) if pricing and usage is not None else 0.0,
        latency=latency, finish_reason=f"error: {type(exc).__name__}", tool_calls=[],
        replayed=False)


@task(cache=False, retries=1, retry_delay=1.0)
def draft_spec(request: str, tasks: list[str], base: str, model: str = "mock",
               policy: str | None = None, repairs: int = 2,
               max_tokens: int = MAX_TOKENS, name: str = "draft") -> dict[str, Any]:
    """Ask ``model`` for a spec that does ``request``; repair it from the validator's problems.

    Returns ``{"spec", "valid", "problems", "unused", "notes", "rounds", "model",
    "stopped", "tasks", "policy"}``: the last spec the model gave and its problems; ``rounds``
    lists the problems found after each answer; ``stopped`` says why repairs ended
    early (a model error after a first draft); ``tasks`` and ``policy``: the catalogue's
    sources and the policy file (the draft's header names them: the draft is checked over
    that catalogue alone, and against that policy at every run).
    """
    from ledgerflow_agents import ModelRequest, ModelResponse, ProviderError, get_model

    ctx = context()
    cat = find_tasks(tasks, base=base)
    pol = load_policy(policy) if policy else None
    llm = get_model(model)
    tool = tool_spec(cat)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _ABOUT + "\n\n" + catalogue_text(cat)},
        {"role": "user", "content": request}]
    rounds: list[dict[str, Any]] = []
    doc: dict[str, Any] | None = None
    best: dict[str, Any] = {"spec": None, "problems": [], "unused": [], "report": None}
    stopped = ""
    for n in range(int(repairs) + 1):
        req = ModelRequest(messages, tools=[tool], tool_choice=TOOL,
                           max_output_tokens=int(max_tokens))
        step = f"answer-{n + 1}"
        done, recorded = ctx.recorded_step(step)
        if done:
            resp = ModelResponse.from_dict(recorded)
        else:
            asked = time.monotonic()
            try:
                resp = llm.complete(req, timeout=None)
            except ProviderError as exc:
                _record_failed(ctx, n + 1, llm, req, exc, time.monotonic() - asked)
                if best["spec"] is None:
                    raise           # nothing drafted yet: the attempt fails (and is retried)
                stopped = f"the model failed during repair {n}: {exc}"
                break
            ctx.record_step(step, resp.to_dict())
        _record(ctx, n + 1, llm, req, resp, done)
        found, why = spec_of(resp.to_dict())
        started = time.monotonic()
        unused: list[dict[str, str]] = []
        if found is None:
            problems = [{"path": "", "code": "draft.no_spec", "message": why,
                         "hint": f"call {TOOL}"}]
        else:
            doc = draft_file.normalise(complete_spec(found, cat, name))
            report = check(doc, folder=base, policy=pol, cwd=os.getcwd(), only=cat.tasks)
            problems = [p.as_dict() for p in report.problems]
            unused = coverage(request, doc)
            best = {"spec": doc, "problems": problems, "unused": unused, "report": report}
        result = json.dumps(problems, sort_keys=True).encode()
        ctx.record_tool_call(
            seq=n + 1, tool="validate_spec",
            arguments_digest=draft_file.spec_digest(doc) if found is not None and doc else "",
            outcome="ok" if not problems else "problems", result_hash=content_digest(result),
            error="" if not problems else f"{len(problems)} problem(s)")
        rounds.append({"round": n + 1, "problems": problems, "unused": unused,
                       "seconds": round(resp.latency_s + time.monotonic() - started, 3)})
        feedback = problems + unused
        if not feedback:
            break
        call_id = resp.tool_calls[0]["id"] if resp.tool_calls else f"call_{n}_0"
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [{"id": call_id, "name": TOOL,
                                         "arguments": found or {}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "name": TOOL,
                         "content": json.dumps(
                             {"valid": not problems, "problems": feedback,
                              "next": "fix every problem; call write_spec again with the "
                                      "whole corrected spec"}, ensure_ascii=False)})
    final = best["report"]
    return {"spec": best["spec"], "valid": best["spec"] is not None and not best["problems"],
            "problems": best["problems"] if best["spec"] is not None
            else (rounds[-1]["problems"] if rounds else []),
            "unused": best["unused"],
            "notes": [p.as_dict() for p in final.notes] if final is not None else [],
            "rounds": rounds, "model": getattr(llm, "name", model), "stopped": stopped,
            "tasks": list(tasks), "policy": policy or ""}


@task(cache=False)
def save_draft(drafted: dict[str, Any], output: str, request: str) -> dict[str, Any]:
    """Write the draft file with its header; record it as this run's output."""
    doc = drafted.get("spec")
    if doc is None:
        return {"path": None, "digest": None, "valid": False,
                "problems": drafted.get("problems", [])}
    ctx = context()
    digest = draft_file.spec_digest(doc)
    header = draft_file.DraftHeader(digest=digest, run=ctx.run_id,
                                    model=str(drafted.get("model", "")), request=request,
                                    problems=len(drafted.get("problems") or []),
                                    tasks=tuple(drafted.get("tasks") or ()),
                                    policy=str(drafted.get("policy") or ""))
    draft_file.write(output, doc, header)
    ctx.record_output(Path(output).resolve().as_uri(), content_hash=digest,
                      machine_written="true", valid=str(bool(drafted.get("valid"))).lower())
    return {"path": output, "digest": digest, "valid": bool(drafted.get("valid")),
            "problems": drafted.get("problems", []), "notes": drafted.get("notes", []),
            "unused": drafted.get("unused", []), "stopped": drafted.get("stopped", ""),
            "rounds": drafted.get("rounds", []), "steps": len(doc.get("tasks") or {})}


def _drafting(request: str, tasks: list[str], output: str, base: str = ".",
              model: str = "mock", policy: str | None = None, repairs: int = 2,
              max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """Draft a spec for ``request`` from the tasks in ``tasks`` and write it to ``output``."""
    drafted = draft_spec(request, tasks, base, model, policy, repairs, max_tokens,
                         Path(output).stem)
    return save_draft(drafted, output, request)


#: The drafting pipeline (``pipeline draft`` runs it; its target is this module).
drafting: Pipeline[..., dict[str, Any]] = Pipeline(_drafting, DRAFTING)
