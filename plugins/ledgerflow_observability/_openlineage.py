"""Emitting OpenLineage events: the client for a target, the backfill, and live emission.

Imported only when the OpenLineage observer is on or a backfill is asked
for (``pipeline lineage RUN_ID --export openlineage FILE``). The events
themselves are built in :mod:`ledgerflow_observability._olevents`; here
they are queued after each commit and emitted from a thread of their own.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import RunEvent
from openlineage.client.serde import Serde
from openlineage.client.transport.file import FileConfig, FileTransport
from openlineage.client.transport.transport import Config, Transport

from ledgerflow.errors import InputError
from ledgerflow.records import AttemptEnded, Record, RunDefined, RunStateChanged, Transition
from ledgerflow.store import RunStore
from ledgerflow.views import TaskRow

from ._olevents import TERMINAL_RUN, cached_events, end_event, events_of, run_event, start_event
from ._olfacets import CUSTOM_FACETS
from ._olnames import Namer
from ._runs import TRACKERS, Artifact, Reused, RunTracker

__all__ = ["CUSTOM_FACETS", "Emitter", "Lineage", "backfill", "client_for"]

log = logging.getLogger("ledgerflow")


# -- transports ------------------------------------------------------------------------

class _StreamTransport(Transport):
    """One event per line on a stream (``--export openlineage -``)."""

    kind = "ledgerflow_stream"
    config_class = Config

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def emit(self, event: Any) -> None:
        self.stream.write(Serde.to_json(event) + "\n")


def client_for(target: str) -> OpenLineageClient:
    """The client for ``file:PATH``, an ``http(s)://`` URL, ``-`` or ``client``."""
    if target == "client":
        return OpenLineageClient()
    if target == "-":
        return OpenLineageClient(transport=_StreamTransport(sys.stdout))
    if target.startswith(("http://", "https://")):
        return OpenLineageClient(config={"transport": {"type": "http", "url": target}})
    path = target[len("file:"):] if target.startswith("file:") else target
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    return OpenLineageClient(transport=FileTransport(FileConfig(log_file_path=path,
                                                                append=True)))


def backfill(run_id: str, store: RunStore, path: str, namespace: str) -> int:
    """Write the events of a finished run to ``path`` (``-``: stdout); return how many."""
    view = store.get_run(run_id, tasks=False)
    if view.state not in TERMINAL_RUN:
        raise InputError(f"run {run_id} is {view.state}; only a finished run can be exported",
                         hint=f"wait for it to end (pipeline status {run_id}), then export")
    events = events_of(run_id, store, namespace)
    client = client_for(path if path == "-" else "file:" + path)
    for ev in events:
        client.emit(ev)
    client.close(5.0)
    return len(events)


# -- live emission -----------------------------------------------------------------------

@dataclass(slots=True)
class _Run:
    tracker: RunTracker
    namer: Namer
    reused: Reused


@dataclass(slots=True)
class Emitter:
    """Emits in a thread of its own, in order, so the driver only queues."""

    client: OpenLineageClient
    q: queue.Queue[Callable[[], list[RunEvent]] | None] = field(
        default_factory=lambda: queue.Queue())
    thread: threading.Thread | None = None
    failures: int = 0

    def put(self, build: Callable[[], list[RunEvent]]) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="ledgerflow-openlineage",
                                           daemon=True)
            self.thread.start()
        self.q.put(build)

    def _loop(self) -> None:
        while True:
            build = self.q.get()
            try:
                if build is None:
                    return
                for ev in build():
                    self.client.emit(ev)
            except Exception:  # a lineage backend must never break a run
                self.failures += 1
                if self.failures <= 3:
                    log.exception("OpenLineage event could not be emitted")
            finally:
                self.q.task_done()

    def drain(self) -> None:
        """Wait until everything queued was emitted."""
        if self.thread is not None and self.thread.is_alive():
            self.q.join()

    def close(self) -> None:
        self.drain()
        if self.thread is not None and self.thread.is_alive():
            self.q.put(None)
            self.thread.join(5)
        self.client.close(5.0)


class Lineage:
    """OpenLineage events of the runs this process drives, made from committed records."""

    def __init__(self, target: str, namespace: str,
                 client: OpenLineageClient | None = None) -> None:
        self.namespace = namespace
        self.emitter = Emitter(client or client_for(target))
        self.runs: dict[str, _Run] = {}

    def committed(self, run_id: str, records: Sequence[Record], store: RunStore) -> None:
        """Queue the events of one commit (built and emitted in the emitter's thread)."""
        commit = TRACKERS.commit(self, run_id, records, store)
        tracker, ended = commit.tracker, commit.ended
        run = self.runs.get(run_id)
        fresh = any(type(r) is RunDefined for r in records)
        if run is None:
            # a submitted run driven for the first time: its START was not emitted yet
            fresh = fresh or commit.first
            run = self.runs[run_id] = _Run(tracker, Namer(self.namespace, ""), Reused(store))
        run.namer.pipeline = tracker.pipeline
        namer = run.namer
        jobs: list[Callable[[], list[RunEvent]]] = []
        if fresh:
            jobs.append(lambda: [run_event(namer, tracker, "START", tracker.created_at)])
        ends = {(e.task.key, e.attempt): e for e in ended}
        for rec in records:         # in commit order
            if isinstance(rec, Transition):
                if rec.to_state == "running":
                    info = tracker.tasks[rec.task_key]
                    jobs.append(_later(start_event, namer, tracker, info, rec.attempt, rec.ts,
                                       tracker.upstream_results(info)))
                elif rec.to_state == "succeeded" and rec.from_state == "ready":
                    info = tracker.tasks[rec.task_key]
                    jobs.append(_later(cached_events, namer, tracker, info, rec.attempt,
                                       rec.ts, _reused(run, info),
                                       tracker.upstream_results(info)))
            elif isinstance(rec, AttemptEnded):
                end = ends.pop((rec.task_key, rec.attempt), None)
                if end is not None:
                    jobs.append(_later(end_event, namer, tracker, end,
                                       tracker.upstream_results(end.task)))
            elif isinstance(rec, RunStateChanged) and rec.state in TERMINAL_RUN:
                jobs.append(_run_end(namer, tracker, rec))
        for job in jobs:
            self.emitter.put(job)

    def finish(self, run_id: str) -> None:
        """The run stopped driving: wait until its events are out."""
        self.runs.pop(run_id, None)
        TRACKERS.finish(self, run_id)
        self.emitter.drain()

    def close(self) -> None:
        """Emit what is queued and close the client."""
        for run_id in list(self.runs):
            TRACKERS.finish(self, run_id)
        self.runs.clear()
        self.emitter.close()


def _reused(run: _Run, info: TaskRow) -> list[Artifact]:
    """The datasets a cache hit keeps (read in the driver: stores are not shared with the
    emitter's thread); a read that fails costs the datasets, never the run."""
    try:
        return run.reused.of(info)
    except Exception:
        log.exception("OpenLineage: the lineage of a cached result could not be read")
        return []


def _run_end(namer: Namer, tracker: RunTracker, s: RunStateChanged
             ) -> Callable[[], list[RunEvent]]:
    return lambda: [run_event(namer, tracker, TERMINAL_RUN[s.state], s.at, s.state, s.reason)]


def _later(fn: Callable[..., Any], namer: Namer, tracker: RunTracker, *args: Any
           ) -> Callable[[], list[RunEvent]]:
    """Build ``fn``'s event(s) later, with the upstream hashes as they are now."""
    *rest, ups = args
    frozen = _Frozen(tracker, ups)

    def build() -> list[RunEvent]:
        out = fn(namer, frozen, *rest)
        return out if isinstance(out, list) else [out]
    return build


class _Frozen:
    """A tracker view whose upstream results are fixed (the event is built in another thread)."""

    __slots__ = ("created_at", "run_id", "target", "ups")

    def __init__(self, tracker: RunTracker, ups: list[tuple[str, str | None]]) -> None:
        self.run_id, self.created_at, self.target = tracker.run_id, tracker.created_at, \
            tracker.target
        self.ups = ups

    def upstream_results(self, info: TaskRow) -> list[tuple[str, str | None]]:
        return self.ups
