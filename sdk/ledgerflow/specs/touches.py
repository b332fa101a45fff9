"""The paths a spec's steps read and write, and the races between steps nothing orders.

From what each step declares (:func:`~ledgerflow.specs.policy.declared`), with
its ``{name}`` placeholders filled from the step's literal arguments; a path
fed by another step is known only at run time and is left out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .policy import Policy, StepUse, declared, fill_need
from .problems import Problem, step_path


def touched(uses: Sequence[StepUse], policy: Policy | None,
            base: str) -> dict[str, list[tuple[str, str]]]:
    """Each absolute path some step declares, with ``(step, "reads" | "writes")``."""
    out: dict[str, list[tuple[str, str]]] = {}
    for use in uses:
        need = declared(use, policy)
        for kind in ("reads", "writes"):
            for template in need[kind]:
                filled = fill_need(template, use)
                if isinstance(filled, str):
                    continue                # known only at run time
                for value in filled:
                    if value in ("*", None):
                        continue
                    path = os.path.normpath(os.path.join(base, os.path.expanduser(str(value))))
                    out.setdefault(path, []).append((use.key, kind))
    return out


def _ancestors(key: str, upstream: Mapping[str, Sequence[str]]) -> set[str]:
    """Every step ``key`` waits for, directly or not."""
    seen: set[str] = set()
    todo = list(upstream.get(key, ()))
    while todo:
        up = todo.pop()
        if up not in seen:
            seen.add(up)
            todo.extend(upstream.get(up, ()))
    return seen


def races(uses: Sequence[StepUse], order: Sequence[str], upstream: Mapping[str, Sequence[str]],
          policy: Policy | None, cwd: str | None) -> list[Problem]:
    """Steps that write a path another step reads or writes, with nothing ordering them.

    ``upstream`` maps each step to the steps it waits for (the graph has no cycle).
    Only the steps that share a path are searched, so a big spec pays nothing
    for the steps that declare no path.
    """
    base = cwd or os.getcwd()
    shared = {p: who for p, who in touched(uses, policy, base).items()
              if len({k for k, _ in who}) > 1 and any(kind == "writes" for _, kind in who)}
    if not shared:
        return []
    ancestors: dict[str, set[str]] = {}

    def before(a: str, b: str) -> bool:
        if b not in ancestors:
            ancestors[b] = _ancestors(b, upstream)
        return a in ancestors[b]

    rank = {k: i for i, k in enumerate(order)}
    problems: list[Problem] = []
    seen: set[tuple[str, str, str]] = set()
    for path, who in shared.items():
        for w, wkind in who:
            if wkind != "writes":
                continue
            for other, okind in who:
                pair = (min(w, other), max(w, other), path)
                if other == w or pair in seen:
                    continue
                first, then = (w, other) if rank.get(w, 0) <= rank.get(other, 0) else (other, w)
                if before(first, then):
                    continue
                seen.add(pair)
                shown = os.path.relpath(path, base) if path.startswith(base) else path
                verb = "reads" if okind == "reads" else "also writes"
                problems.append(Problem(
                    path=step_path(other), code="graph.race",
                    message=f"step {other!r} {verb} {shown!r}, which step {w!r} writes, but "
                    "nothing orders the two steps",
                    hint=f'add after = ["{w}"] to step {other!r} (or order them the other way)'))
    return problems
