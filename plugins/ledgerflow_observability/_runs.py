"""What an observer knows of a run: its tasks and attempts, folded from committed records.

:class:`RunTracker` folds the records of each commit
(``ledgerflow_records_committed``) into the little the observers need
(task names, code versions, upstream keys, result hashes, when each attempt
started) and hands back each attempt that ended in the commit with its
result and lineage. A resumed run starts from what the store holds
(:meth:`RunTracker.from_store`); a backfill builds the same from a finished
run (:func:`attempts_of`). No observability library is imported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledgerflow.records import (
    ArtifactRecorded,
    AttemptEnded,
    Record,
    ResultRecorded,
    RunDefined,
    RunStateChanged,
    TaskCreated,
    Transition,
)
from ledgerflow.store import RunStore
from ledgerflow.views import RunView

#: An artifact of one attempt: (direction, uri, content hash, attrs).
Artifact = tuple[str, str, "str | None", dict[str, str]]


@dataclass(slots=True)
class TaskInfo:
    """One task as the observers see it."""

    key: str
    name: str = ""
    node: str = ""
    item_key: str | None = None
    position: int | None = None
    upstream: Sequence[str] = ()
    code_version: str = ""
    state: str = ""
    ready_at: float | None = None
    result_hash: str | None = None
    result_attempt: int = 0
    fingerprint: str | None = None
    cached_from: str | None = None


@dataclass(slots=True)
class Ended:
    """An attempt that ended, with what it produced (the same live and in a backfill)."""

    task: TaskInfo
    attempt: int
    outcome: str
    running_at: float | None       # its ``running`` transition
    ready_at: float | None         # the ``ready`` transition before it (None: not known)
    started_at: float | None       # when the task's code began (None: not known)
    ended_at: float
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    result_hash: str | None = None     # ok attempts
    fingerprint: str | None = None
    artifacts: list[Artifact] = field(default_factory=list)


class RunTracker:
    """The observers' picture of one run (see the module docstring)."""

    __slots__ = ("children", "created_at", "pipeline", "readied", "run_id", "running",
                 "state", "target", "tasks")

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.pipeline = ""
        self.target: str | None = None
        self.created_at = 0.0
        self.state = ""
        self.tasks: dict[str, TaskInfo] = {}
        self.children: dict[str, list[tuple[int, str]]] = {}
        #: (task, attempt) -> time of its running transition / of the ready before it
        self.running: dict[tuple[str, int], float] = {}
        self.readied: dict[tuple[str, int], float] = {}

    @classmethod
    def from_store(cls, run_id: str, store: RunStore) -> RunTracker:
        """The run as the store holds it (a resume: what earlier drives recorded)."""
        tracker = cls(run_id)
        tracker.seed(store.get_run(run_id), store.events(run_id))
        return tracker

    def seed(self, view: RunView, events: Iterable[dict[str, Any]]) -> None:
        """Take the run's tasks from ``view`` and attempt start times from ``events``."""
        self.pipeline, self.target, self.created_at = view.pipeline, view.target, view.created_at
        self.state = view.state
        for row in view.tasks.values():
            info = TaskInfo(row.key, row.task_name, row.node, row.item_key, row.position,
                            list(row.upstream), row.code_version, row.state, None,
                            row.result_hash, row.result_attempt, row.fingerprint,
                            row.cached_from)
            self._add(info)
        for e in events:
            key = e["task_key"]
            if e["to_state"] == "running":
                self.running[(key, e["attempt"])] = e["ts"]
                ready = self.tasks[key].ready_at if key in self.tasks else None
                if ready is not None:
                    self.readied[(key, e["attempt"])] = ready
            elif e["to_state"] == "ready" and key in self.tasks:
                self.tasks[key].ready_at = e["ts"]

    def _add(self, info: TaskInfo) -> None:
        self.tasks[info.key] = info
        if info.position is not None:
            self.children.setdefault(info.node, []).append((info.position, info.key))

    def task(self, key: str) -> TaskInfo:
        """The task ``key`` (an empty one if no record named it)."""
        info = self.tasks.get(key)
        if info is None:
            info = self.tasks[key] = TaskInfo(key, name=key, node=key)
        return info

    def apply(self, records: Sequence[Record]) -> list[Ended]:
        """Fold one commit's records; return the attempts that ended in it."""
        ended: list[AttemptEnded] = []
        results: dict[tuple[str, int], ResultRecorded] = {}
        artifacts: dict[tuple[str, int], list[Artifact]] = {}
        tasks = self.tasks
        for rec in records:
            if isinstance(rec, Transition):
                info = tasks.get(rec.task_key) or self.task(rec.task_key)
                info.state = rec.to_state
                if rec.to_state == "ready":
                    info.ready_at = rec.ts
                elif rec.to_state == "running":
                    self.running[(rec.task_key, rec.attempt)] = rec.ts
                    if info.ready_at is not None:
                        self.readied[(rec.task_key, rec.attempt)] = info.ready_at
            elif isinstance(rec, TaskCreated):
                self._add(TaskInfo(rec.task_key, rec.task_name, rec.node, rec.item_key,
                                   rec.position, rec.upstream, rec.code_version))
            elif isinstance(rec, AttemptEnded):
                ended.append(rec)
            elif isinstance(rec, ResultRecorded):
                info = self.task(rec.task_key)
                info.result_hash, info.result_attempt = rec.content_hash, rec.attempt
                info.fingerprint, info.cached_from = rec.fingerprint, rec.cached_from
                results[(rec.task_key, rec.attempt)] = rec
            elif isinstance(rec, ArtifactRecorded):
                artifacts.setdefault((rec.task_key, rec.attempt), []).append(
                    (rec.direction, rec.uri, rec.content_hash, dict(rec.attrs or {})))
            elif isinstance(rec, RunDefined):
                self.pipeline, self.target, self.created_at = (rec.pipeline, rec.target,
                                                               rec.created_at)
            elif isinstance(rec, RunStateChanged):
                self.state = rec.state
        out: list[Ended] = []
        for done in ended:
            k = (done.task_key, done.attempt)
            res = results.get(k) if done.outcome == "ok" else None
            out.append(Ended(self.task(done.task_key), done.attempt, done.outcome,
                             self.running.pop(k, None), self.readied.pop(k, None),
                             done.started_at,
                             done.ended_at if done.ended_at is not None else 0.0,
                             done.error_type, done.error_message, done.traceback,
                             res.content_hash if res is not None else None,
                             res.fingerprint if res is not None else None,
                             artifacts.get(k, [])))
        return out

    def upstream_results(self, info: TaskInfo) -> list[tuple[str, str | None]]:
        """``(task key, content hash)`` of the results ``info`` read, in lineage order.

        An upstream fan-out stands for all its children in item order (as in
        ``pipeline lineage``).
        """
        out: list[tuple[str, str | None]] = []
        for up in info.upstream:
            src = self.tasks.get(up)
            if src is not None and src.position is None:
                out.append((up, src.result_hash))
                continue
            kids = self.children.get(up)
            if kids is None:
                if src is not None:
                    out.append((up, src.result_hash))
                continue
            for _, key in sorted(kids):
                out.append((key, self.tasks[key].result_hash))
        return out


def _artifacts(lineage: Iterable[dict[str, Any]]) -> dict[tuple[str, int], list[Artifact]]:
    """The recorded artifacts among lineage rows, by ``(task key, attempt)``."""
    arts: dict[tuple[str, int], list[Artifact]] = {}
    for row in lineage:
        if str(row["uri"]).startswith("task:"):
            continue     # results of tasks, derived from task rows (not recorded artifacts)
        arts.setdefault((row["task_key"], int(row["attempt"])), []).append(
            (row["direction"], row["uri"], row["content_hash"], dict(row.get("attrs") or {})))
    return arts


class Reused:
    """The artifacts of the attempts that cache hits reuse (read once per source run).

    A cache hit records no artifacts of its own; its lineage is that of the
    attempt whose result it reuses: in the run ``cached_from``, the task with
    the same fingerprint (followed when that one was a cache hit too).
    """

    __slots__ = ("runs", "store")
    _HOPS = 8

    def __init__(self, store: RunStore) -> None:
        self.store = store
        #: source run -> (fingerprint -> (key, result attempt, cached_from), artifacts)
        self.runs: dict[str, tuple[dict[str, tuple[str, int, str | None]],
                                   dict[tuple[str, int], list[Artifact]]]] = {}

    def _run(self, run_id: str) -> tuple[dict[str, tuple[str, int, str | None]],
                                         dict[tuple[str, int], list[Artifact]]]:
        got = self.runs.get(run_id)
        if got is None:
            view = self.store.get_run(run_id)
            by_fp = {row.fingerprint: (row.key, row.result_attempt, row.cached_from)
                     for row in view.tasks.values() if row.fingerprint}
            got = self.runs[run_id] = (by_fp, _artifacts(self.store.lineage(run_id)))
        return got

    def of(self, info: TaskInfo) -> list[Artifact]:
        """The artifacts of the attempt ``info``'s cached result came from ([]: unknown)."""
        source, fp = info.cached_from, info.fingerprint
        for _ in range(self._HOPS):
            if source is None or fp is None:
                return []
            try:
                by_fp, arts = self._run(source)
            except Exception:    # the source run was deleted: no lineage to keep
                return []
            found = by_fp.get(fp)
            if found is None:
                return []
            key, attempt, earlier = found
            if earlier is None:
                return list(arts.get((key, attempt), []))
            source = earlier
        return []


def attempts_of(view: RunView, attempts: Iterable[dict[str, Any]],
                events: Sequence[dict[str, Any]], lineage: Iterable[dict[str, Any]],
                reused: Reused | None = None
                ) -> tuple[RunTracker, list[Ended], list[tuple[TaskInfo, int, float,
                                                               list[Artifact]]]]:
    """A finished run as the live observers saw it: the tracker, every ended attempt,
    and every cache hit ``(task, attempt, time, artifacts)``, from the store's readers."""
    tracker = RunTracker(view.run_id)
    tracker.seed(view, events)
    arts = _artifacts(lineage)
    ended: list[Ended] = []
    for a in attempts:
        info = tracker.task(a["task_key"])
        n = int(a["attempt"])
        ok = a["outcome"] == "ok" and info.result_attempt == n and info.cached_from is None
        ended.append(Ended(info, n, a["outcome"], tracker.running.get((info.key, n)),
                           tracker.readied.get((info.key, n)), a["started_at"],
                           a["ended_at"] or 0.0, a["error_type"] or "",
                           a["error_message"] or "", a["traceback"] or "",
                           info.result_hash if ok else None, info.fingerprint if ok else None,
                           arts.get((info.key, n), [])))
    cached = []
    for e in events:
        if e["to_state"] == "succeeded" and e["from_state"] == "ready":
            info = tracker.task(e["task_key"])
            cached.append((info, int(e["attempt"]), float(e["ts"]),
                           reused.of(info) if reused is not None else []))
    return tracker, ended, cached
