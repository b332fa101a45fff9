"""What an observer knows of a run: the core's view of it, and its attempts as they end.

:class:`RunTracker` keeps the run as the core's projection folds it (a
:class:`~ledgerflow.views.RunView`, each commit's records applied with
:func:`ledgerflow.projection.apply`; a resumed run starts from the store's
view, :meth:`RunTracker.from_store`) and adds only what the view does not
hold: when each attempt started and the ``ready`` before it, the children of
each fan-out, and each attempt that ended in a commit with its result and
lineage (:class:`Ended`). The observers of a process share one tracker per
run (:data:`TRACKERS`): each commit is folded once, by whichever observer
sees it first. A backfill builds the same from a finished run
(:func:`attempts_of`). No observability library is imported here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledgerflow.projection import apply as fold
from ledgerflow.records import (
    ArtifactRecorded,
    AttemptEnded,
    Record,
    ResultRecorded,
    RunDefined,
    TaskCreated,
    Transition,
)
from ledgerflow.store import RunStore
from ledgerflow.views import RunView, TaskRow

#: An artifact of one attempt: (direction, uri, content hash, attrs).
Artifact = tuple[str, str, "str | None", dict[str, str]]


@dataclass(slots=True)
class Ended:
    """An attempt that ended, with what it produced (the same live and in a backfill)."""

    task: TaskRow
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

    __slots__ = ("children", "readied", "ready_at", "running", "view")

    def __init__(self, run_id: str, view: RunView | None = None) -> None:
        self.view: RunView = view if view is not None else RunView(run_id, state="")
        self.children: dict[str, list[tuple[int, str]]] = {}
        #: task -> time of its last ``ready``; (task, attempt) -> time of its running
        #: transition / of the ready before it
        self.ready_at: dict[str, float] = {}
        self.running: dict[tuple[str, int], float] = {}
        self.readied: dict[tuple[str, int], float] = {}
        for row in self.view.tasks.values():
            if row.position is not None:
                self.children.setdefault(row.node, []).append((row.position, row.key))

    # what the event builders read of the run
    @property
    def run_id(self) -> str:
        return self.view.run_id

    @property
    def pipeline(self) -> str:
        return self.view.pipeline

    @property
    def target(self) -> str | None:
        return self.view.target

    @property
    def created_at(self) -> float:
        return self.view.created_at

    @property
    def state(self) -> str:
        return self.view.state

    @property
    def tasks(self) -> dict[str, TaskRow]:
        return self.view.tasks

    @classmethod
    def from_store(cls, run_id: str, store: RunStore) -> RunTracker:
        """The run as the store holds it (a resume: what earlier drives recorded)."""
        tracker = cls(run_id, store.get_run(run_id))
        tracker.seed(store.events(run_id))
        return tracker

    def seed(self, events: Iterable[dict[str, Any]]) -> None:
        """Take the attempts' start times from the run's transitions ``events``."""
        ready_at = self.ready_at
        for e in events:
            key = e["task_key"]
            if e["to_state"] == "running":
                self.running[(key, e["attempt"])] = e["ts"]
                ready = ready_at.get(key)
                if ready is not None:
                    self.readied[(key, e["attempt"])] = ready
            elif e["to_state"] == "ready":
                ready_at[key] = e["ts"]

    def task(self, key: str) -> TaskRow:
        """The task ``key`` (an empty one if no record named it)."""
        row = self.view.tasks.get(key)
        if row is None:
            row = self.view.tasks[key] = TaskRow(key, task_name=key, node=key)
        return row

    def apply(self, records: Sequence[Record]) -> list[Ended]:
        """Fold one commit's records; return the attempts that ended in it."""
        fold(self.view, records)
        ended: list[AttemptEnded] = []
        results: dict[tuple[str, int], ResultRecorded] = {}
        artifacts: dict[tuple[str, int], list[Artifact]] = {}
        ready_at = self.ready_at
        for rec in records:
            t = type(rec)       # exact types, as the projection dispatches (the fastest)
            if t is Transition:
                e: Transition = rec  # type: ignore[assignment]
                if e.to_state == "ready":
                    ready_at[e.task_key] = e.ts
                elif e.to_state == "running":
                    k = (e.task_key, e.attempt)
                    self.running[k] = e.ts
                    ready = ready_at.get(e.task_key)
                    if ready is not None:
                        self.readied[k] = ready
            elif t is AttemptEnded:
                ended.append(rec)  # type: ignore[arg-type]
            elif t is ResultRecorded:
                r: ResultRecorded = rec  # type: ignore[assignment]
                results[(r.task_key, r.attempt)] = r
            elif t is TaskCreated:
                c: TaskCreated = rec  # type: ignore[assignment]
                if c.position is not None:
                    self.children.setdefault(c.node, []).append((c.position, c.task_key))
            elif t is ArtifactRecorded:
                a: ArtifactRecorded = rec  # type: ignore[assignment]
                artifacts.setdefault((a.task_key, a.attempt), []).append(
                    (a.direction, a.uri, a.content_hash, dict(a.attrs or {})))
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

    def upstream_results(self, info: TaskRow) -> list[tuple[str, str | None]]:
        """``(task key, content hash)`` of the results ``info`` read, in lineage order.

        An upstream fan-out stands for all its children in item order (as in
        ``pipeline lineage``).
        """
        tasks = self.view.tasks
        out: list[tuple[str, str | None]] = []
        for up in info.upstream:
            src = tasks.get(up)
            if src is not None and src.position is None:
                out.append((up, src.result_hash))
                continue
            kids = self.children.get(up)
            if kids is None:
                if src is not None:
                    out.append((up, src.result_hash))
                continue
            for _, key in sorted(kids):
                out.append((key, tasks[key].result_hash))
        return out


@dataclass(slots=True)
class Commit:
    """What one commit told the observers of a run."""

    tracker: RunTracker
    ended: list[Ended]
    #: The run had no task before this commit (a new run, or a submitted run's first drive).
    first: bool


@dataclass(slots=True)
class _Shared:
    tracker: RunTracker
    owners: set[int] = field(default_factory=set)
    last: Sequence[Record] | None = None       # the commit folded last (held: ``is``)
    commit: Commit | None = None


class Trackers:
    """One :class:`RunTracker` per run for every observer of this process.

    Every observer's ``ledgerflow_records_committed`` gets the same records
    object of a commit: the first to call :meth:`commit` with it folds it, the
    others get the same :class:`Commit`. A tracker is dropped when every
    observer that used it has called :meth:`finish`.
    """

    def __init__(self) -> None:
        self._runs: dict[str, _Shared] = {}
        self._lock = threading.Lock()

    def commit(self, owner: object, run_id: str, records: Sequence[Record],
               store: RunStore) -> Commit:
        """The run after ``records`` (a resumed run starts from what ``store`` holds)."""
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is None:
                fresh = any(type(r) is RunDefined for r in records)
                tracker = RunTracker(run_id) if fresh else RunTracker.from_store(run_id, store)
                entry = self._runs[run_id] = _Shared(tracker)
            entry.owners.add(id(owner))
            if entry.last is not records or entry.commit is None:
                first = not entry.tracker.tasks
                entry.commit = Commit(entry.tracker, entry.tracker.apply(records), first)
                entry.last = records
            return entry.commit

    def get(self, run_id: str) -> RunTracker | None:
        """The tracker of a run some observer follows now, or None."""
        entry = self._runs.get(run_id)
        return None if entry is None else entry.tracker

    def finish(self, owner: object, run_id: str) -> None:
        """``owner`` is done with the run (its drive stopped)."""
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is not None:
                entry.owners.discard(id(owner))
                if not entry.owners:
                    del self._runs[run_id]


#: The trackers of the runs this process drives.
TRACKERS = Trackers()


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

    def of(self, info: TaskRow) -> list[Artifact]:
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
                ) -> tuple[RunTracker, list[Ended], list[tuple[TaskRow, int, float,
                                                               list[Artifact]]]]:
    """A finished run as the live observers saw it: the tracker, every ended attempt,
    and every cache hit ``(task, attempt, time, artifacts)``, from the store's readers."""
    tracker = RunTracker(view.run_id, view)
    tracker.seed(events)
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
