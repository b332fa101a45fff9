"""Why each task of a run ran or was reused, from what the ledger holds (``pipeline explain``).

A task's fingerprint is its code version, its literal arguments (a fan-out
child's item included) and the content hashes of its upstream results
(:mod:`ledgerflow.keys`). The ledger keeps, per task, the code version, the
upstream task keys, the fingerprint and content hash of its result, the run it
was reused from (``cached_from``) and every transition with its reason (a
``verify`` rejection lands in the ``running`` transition). It does not keep a
task's literal arguments, only the run's parameters: a changed argument is
told by the fingerprint differing while code and inputs are the same, and the
run parameters that differ are named.

Each task is compared with the same key in a *baseline*: ``against``, else the
latest earlier run of the same pipeline and target. Reasons, first one wins:

``cached``        reused: the result of run X's task K (same fingerprint)
``verify``        a cache hit was rejected by the task's ``verify=`` (its effect was gone)
``new``           no task with this key in the baseline (or no baseline)
``failed_before`` in the baseline the task did not succeed, so nothing could be reused
``code``          its code version changed (which task function, old -> new)
``input``         an upstream result changed (which upstream, old -> new content hash)
``argument``      same code and inputs, other fingerprint: a literal argument or its
                  fan-out item changed (the run parameters that differ are named)
``not_reused``    same fingerprint as the baseline, but not reused (``cache=False``, or
                  its stored result was gone)
``not_run``       the task did not run in this run (pending, cancelled, upstream failed)
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import TaskNotFoundError
from .store import RunStore, reading
from .views import RunView, TaskRow

#: Every reason, in the order the text output groups them.
REASONS: tuple[str, ...] = ("cached", "verify", "new", "failed_before", "code", "input",
                            "argument", "not_reused", "not_run")

_CACHED = "cached: same fingerprint as "
_VERIFY = "cache hit rejected by verify"
_ENDED = ("failed", "cancelled", "upstream_failed")


@dataclass(slots=True)
class Explanation:
    """Why one task ran or was reused: ``reason`` (one of :data:`REASONS`) and its detail."""

    key: str
    task: str
    state: str
    reason: str
    detail: str
    #: every reason that holds, the deciding one first (code and input may both change)
    reasons: list[str] = field(default_factory=list)
    #: run and task key the result came from (cached) or was compared with (baseline)
    source_run: str | None = None
    source_key: str | None = None
    #: what changed: ``{"code": [old, new]}``, ``{"inputs": {key: [old, new]}}``,
    #: ``{"params": {name: [old, new]}}``
    changes: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "task": self.task, "state": self.state,
                "reason": self.reason, "reasons": self.reasons, "detail": self.detail,
                "source_run": self.source_run, "source_key": self.source_key,
                "changes": self.changes, "attempts": self.attempts}


@dataclass(slots=True)
class RunExplanation:
    """The explanations of a run's tasks, against one baseline run (or none)."""

    run_id: str
    pipeline: str
    against: str | None
    trigger: dict[str, Any] | None
    tasks: list[Explanation]

    def counts(self) -> dict[str, int]:
        """Number of tasks per reason, in :data:`REASONS` order."""
        out = {r: 0 for r in REASONS}
        for t in self.tasks:
            out[t.reason] += 1
        return {r: n for r, n in out.items() if n}

    def groups(self) -> dict[str, list[Explanation]]:
        """The tasks per reason, in :data:`REASONS` order."""
        out: dict[str, list[Explanation]] = {r: [] for r in REASONS}
        for t in self.tasks:
            out[t.reason].append(t)
        return {r: ts for r, ts in out.items() if ts}

    def by_key(self) -> dict[str, Explanation]:
        return {t.key: t for t in self.tasks}

    def _repr_html_(self, rows: int = 8) -> str:
        """The notebook display: one row per reason, its first tasks and their detail."""
        from html import escape
        head = f"<b>run {escape(self.run_id)}</b> compared with {escape(self.against or 'no earlier run')}"
        body = []
        for reason, tasks in self.groups().items():
            shown = "<br>".join(f"<code>{escape(t.key)}</code> {escape(t.detail)}"
                                for t in tasks[:rows])
            more = f"<br>... and {len(tasks) - rows} more" if len(tasks) > rows else ""
            body.append(f"<tr><td>{escape(reason)}</td><td>{len(tasks)}</td>"
                        f"<td style='text-align:left'>{shown}{more}</td></tr>")
        return (f"<div>{head}<table><tr><th>reason</th><th>tasks</th><th>which, and why</th>"
                f"</tr>{''.join(body)}</table></div>")

    def as_json(self) -> dict[str, Any]:
        """The document ``pipeline explain --json`` prints."""
        return {"run_id": self.run_id, "pipeline": self.pipeline, "against": self.against,
                "trigger": self.trigger, "counts": self.counts(),
                "tasks": [t.as_json() for t in self.tasks]}


def baseline_of(st: RunStore, view: RunView, limit: int = 500) -> str | None:
    """The latest run before ``view`` of the same pipeline and target (None: none)."""
    earlier = [r for r in st.list_runs(limit=limit)
               if r.run_id != view.run_id and r.pipeline == view.pipeline
               and r.target == view.target and r.created_at <= view.created_at]
    if not earlier:
        return None
    return max(earlier, key=lambda r: (r.created_at, r.run_id)).run_id


def explain_run(st: RunStore, run_id: str, *, task_key: str | None = None,
                against: str | None = None) -> RunExplanation:
    """Explain every task of ``run_id`` (or only ``task_key``) against ``against``
    (default: :func:`baseline_of`). Raises RunNotFoundError, TaskNotFoundError."""
    with reading(st):
        view = st.get_run(run_id)
        if task_key is not None and task_key not in view.tasks:
            raise TaskNotFoundError(run_id, task_key, view.tasks)
        base_id = against if against is not None else baseline_of(st, view)
        base = st.get_run(base_id) if base_id is not None else None
        events = st.events(run_id, task_key)
        attempts = st.attempts(run_id, task_key)
        rows = [view.tasks[task_key]] if task_key is not None else view.in_order()
        why = _Why(st, view, base, events, attempts)
        tasks = [why.explain(row) for row in rows]
    return RunExplanation(run_id, view.pipeline, base_id, _trigger(view), tasks)


def _trigger(view: RunView) -> dict[str, Any] | None:
    try:
        trig = json.loads(view.options or "{}").get("trigger")
    except (ValueError, AttributeError):
        return None
    return trig if isinstance(trig, dict) else None


class _Why:
    """The comparisons of one run with its baseline (rows, hashes, parameters)."""

    def __init__(self, st: RunStore, view: RunView, base: RunView | None,
                 events: Iterable[dict[str, Any]], attempts: Iterable[dict[str, Any]]) -> None:
        self.st, self.view, self.base = st, view, base
        self.cached_key: dict[str, str] = {}
        self.rejected: dict[str, str] = {}
        self.reset: set[str] = set()     # tasks a resume of this run set to run again
        for e in events:
            reason = e.get("reason") or ""
            if e["to_state"] == "pending" and e["from_state"] is not None:
                self.reset.add(e["task_key"])
            elif e["to_state"] == "succeeded" and reason.startswith(_CACHED):
                self.cached_key[e["task_key"]] = reason[len(_CACHED):].partition("/")[2]
            elif e["to_state"] == "running" and _VERIFY in reason:
                self.rejected[e["task_key"]] = reason[reason.index(_VERIFY):]
        # fan-out nodes some child of which was reused: a change of their first upstream
        # (the list they are mapped over) is a change of the rerun children's items, not of
        # an input every child reads (that would have changed every child's fingerprint)
        self.kept_nodes = {r.node for r in view.tasks.values()
                           if r.position is not None and r.cached_from is not None}
        self.failures: dict[str, list[str]] = {}
        for a in attempts:
            if a["outcome"] not in ("ok", "waiting"):
                self.failures.setdefault(a["task_key"], []).append(
                    f"attempt {a['attempt']} {a['outcome']}"
                    + (f" ({a['error_type']})" if a.get("error_type") else ""))
        self.params = _params_diff(base.params if base else "{}", view.params) if base else {}

    def explain(self, row: TaskRow) -> Explanation:
        ex = Explanation(row.key, row.task_name, row.state, "", "", attempts=row.attempts)
        retried = self.failures.get(row.key)
        if row.cached_from is not None:
            ex.source_run, ex.source_key = row.cached_from, self.cached_key.get(row.key, row.key)
            ex.reasons = ["cached"]
            ex.detail = f"cache hit: the result of {ex.source_run}/{ex.source_key}"
            return self._done(ex)
        if row.attempts == 0:
            ex.reasons = ["not_run"]
            ex.detail = f"did not run: {row.state}" + (f" ({row.error})" if row.error else "")
            return self._done(ex)
        if row.key in self.rejected:
            ex.reasons.append("verify")
        old = self.base.tasks.get(row.key) if self.base is not None else None
        if old is None:
            ex.reasons.append("new")
        else:
            ex.source_run, ex.source_key = self.base.run_id, old.key  # type: ignore[union-attr]
            self._compare(ex, row, old)
        ex.detail = self._detail(ex, row, old)
        if retried:     # "then ran again" only if another attempt came after the last one
            again = ", then ran again" if row.attempts > len(retried) else ""
            if again and row.key in self.reset:
                again += " when the run was resumed"
            ex.detail += "; in this run: " + ", ".join(retried) + again
        return self._done(ex)

    def _compare(self, ex: Explanation, row: TaskRow, old: TaskRow) -> None:
        if old.state != "succeeded":
            ex.reasons.append("failed_before")
        if old.code_version != row.code_version:
            ex.reasons.append("code")
            ex.changes["code"] = [old.code_version, row.code_version]
        # an equal fingerprint means equal inputs; a fan-out child also names the list
        # it was mapped over, which is not in its fingerprint (its item is)
        same = row.fingerprint is not None and row.fingerprint == old.fingerprint
        inputs = {} if same else self._inputs_diff(row)
        if inputs:
            ex.reasons.append("input")
            ex.changes["inputs"] = inputs
        if "code" not in ex.reasons and not inputs and old.state == "succeeded":
            if row.fingerprint is None or row.fingerprint != old.fingerprint:
                ex.reasons.append("argument")
                if self.params:
                    ex.changes["params"] = self.params
            else:
                ex.reasons.append("not_reused")

    def _detail(self, ex: Explanation, row: TaskRow, old: TaskRow | None) -> str:
        first = ex.reasons[0]
        base = self.base.run_id if self.base is not None else None
        if first == "verify":
            return f"ran: {self.rejected[row.key]} (its effect was gone)"
        if first == "new":
            return f"ran: new, no task {row.key!r} in {base}" if base else \
                "ran: new, no earlier run of this pipeline"
        if first == "failed_before":
            assert old is not None
            ended = f"it ended {old.state}" if old.state in _ENDED else \
                f"it did not finish ({old.state})"
            return f"ran: in {base} {ended}" + (f" ({old.error})" if old.error
                                                 else "") + ", nothing to reuse"
        if first == "code":
            was, now = ex.changes["code"]
            text = f"ran: the code of task {row.task_name!r} changed ({was} -> {now})"
            if "input" in ex.reasons:
                text += "; " + _inputs_text(ex.changes["inputs"])
            return text
        if first == "input":
            return "ran: " + _inputs_text(ex.changes["inputs"])
        if first == "argument":
            params = ex.changes.get("params")
            if params:
                return "ran: a parameter changed: " + ", ".join(
                    f"{k} {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in params.items())
            if row.item_key is not None:
                item = row.item_key.strip("[]")
                return f"ran: its fan-out item {item!r} changed (same key, new value)"
            return "ran: a literal argument changed"
        assert old is not None
        gone = old.result_uri is not None and not self.st.blob_exists(old.result_uri)
        return (f"ran: same fingerprint as {base}/{old.key}, but "
                + ("its stored result is gone" if gone else
                   "not reused (the task has cache=False)"))

    def _inputs_diff(self, row: TaskRow) -> dict[str, list[str | None]]:
        base = self.base
        assert base is not None
        out: dict[str, list[str | None]] = {}
        ups = row.upstream
        first = self.view.tasks.get(ups[0]) if ups else None
        if row.position is not None and row.node in self.kept_nodes and first is not None \
                and first.position is None:
            ups = ups[1:]   # the one task whose whole list it is mapped over: its item is
            #                 an argument (over a fan-out, its own upstream child is an input)
        for up in ups:
            now, was = _upstream_hashes(self.view, up), _upstream_hashes(base, up)
            for key in sorted(now.keys() | was.keys(), key=lambda k: (k not in now, k)):
                if now.get(key) != was.get(key):
                    out[key] = [was.get(key), now.get(key)]
        return out

    @staticmethod
    def _done(ex: Explanation) -> Explanation:
        ex.reason = ex.reasons[0]
        return ex


def _upstream_hashes(view: RunView, up: str) -> dict[str, str | None]:
    """Content hash of the upstream ``up``: one task, or each child of a fan-out node."""
    row = view.tasks.get(up)
    if row is not None:
        return {up: row.result_hash}
    return {r.key: r.result_hash for r in view.tasks.values()
            if r.node == up and r.position is not None}


def _inputs_text(inputs: dict[str, list[str | None]]) -> str:
    parts = []
    for key, (was, now) in list(inputs.items())[:5]:
        if was is None:
            parts.append(f"{key} is new ({_short(now)})")
        elif now is None:
            parts.append(f"{key} is gone (was {_short(was)})")
        else:
            parts.append(f"{key} {_short(was)} -> {_short(now)}")
    more = f" and {len(inputs) - 5} more" if len(inputs) > 5 else ""
    return "an input changed: " + ", ".join(parts) + more


def _short(h: str | None) -> str:
    return (h or "none")[:12]


def _params_diff(old: str, new: str) -> dict[str, list[Any]]:
    try:
        a, b = json.loads(old or "{}"), json.loads(new or "{}")
    except ValueError:
        return {}
    return {k: [a.get(k), b.get(k)] for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}
