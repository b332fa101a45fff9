"""Everything that touches openlineage-python: events of attempts and runs, and emitting them.

Imported only when the OpenLineage observer is on or a backfill is asked
for (``pipeline lineage RUN_ID --export openlineage FILE``). Live and
backfill events come from one function, :func:`events_of`'s parts
(:func:`attempt_events`, :func:`run_event`), fed the same facts
(:mod:`ledgerflow_observability._runs`), so a backfill of a run equals what
was emitted while it ran.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any, ClassVar

import attr
from openlineage.client import OpenLineageClient
from openlineage.client import __version__ as client_version
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    DatasetFacet,
    JobFacet,
    RunFacet,
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    parent_run,
    processing_engine_run,
)
from openlineage.client.serde import Serde
from openlineage.client.transport.file import FileConfig, FileTransport
from openlineage.client.transport.transport import Config, Transport
from openlineage.client.uuid import generate_static_uuid

import ledgerflow
from ledgerflow.errors import InputError
from ledgerflow.records import AttemptEnded, Record, RunDefined, RunStateChanged, Transition
from ledgerflow.store import RunStore

from ._runs import Artifact, Ended, RunTracker, TaskInfo, attempts_of
from .genai import usage_rows

#: What the event builders read of a run (a tracker, or a snapshot of one).
Facts = Any

log = logging.getLogger("ledgerflow")

PRODUCER = f"urn:ledgerflow:{ledgerflow.__version__}"
SCHEMA = "urn:ledgerflow:openlineage:1-0-0:{name}.json#/$defs/{name}"
_TERMINAL_RUN = {"succeeded": "COMPLETE", "failed": "FAIL", "cancelled": "ABORT"}
_OUTCOME = {"ok": "COMPLETE", "error": "FAIL", "timeout": "FAIL", "lost": "FAIL",
            "cancelled": "ABORT"}


# -- custom facets (their JSON schemas ship in schemas/) ---------------------------------

@attr.define
class LedgerflowTaskRunFacet(RunFacet):
    """Which ledgerflow task attempt an OpenLineage run is."""

    runId: str
    taskKey: str
    attempt: int
    outcome: str | None = attr.field(default=None)
    itemKey: str | None = attr.field(default=None)
    fingerprint: str | None = attr.field(default=None)
    cachedFrom: str | None = attr.field(default=None)
    _additional_skip_redact: ClassVar[list[str]] = ["runId", "taskKey", "attempt"]

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowTaskRunFacet")


@attr.define
class LedgerflowRunRunFacet(RunFacet):
    """The ledgerflow run behind an OpenLineage pipeline run."""

    runId: str
    target: str | None = attr.field(default=None)
    state: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowRunRunFacet")


@attr.define
class LedgerflowModelUsageRunFacet(RunFacet):
    """Model calls of one attempt: totals and one entry per provider and model."""

    calls: int
    inputTokens: int
    outputTokens: int
    models: list[dict[str, Any]] = attr.field(factory=list)
    costUsd: float | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowModelUsageRunFacet")


@attr.define
class LedgerflowCodeJobFacet(JobFacet):
    """The task (or pipeline) name and the code version its results depend on."""

    task: str
    codeVersion: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowCodeJobFacet")


@attr.define
class LedgerflowArtifactDatasetFacet(DatasetFacet):
    """What the task said about an artifact it recorded (``record_input(..., **attrs)``)."""

    attrs: dict[str, str]

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA.format(name="LedgerflowArtifactDatasetFacet")


CUSTOM_FACETS = (LedgerflowTaskRunFacet, LedgerflowRunRunFacet, LedgerflowModelUsageRunFacet,
                 LedgerflowCodeJobFacet, LedgerflowArtifactDatasetFacet)


# -- building events -------------------------------------------------------------------

def _time(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


def _uuid(ts: float, *parts: object) -> str:
    data = "\x00".join(str(p) for p in parts).encode()
    return str(generate_static_uuid(datetime.fromtimestamp(ts, timezone.utc), data))


def run_uuid(tracker: Facts) -> str:
    """The OpenLineage run id of a ledgerflow run (stable: creation time + run id)."""
    return _uuid(tracker.created_at, "ledgerflow-run", tracker.run_id)


def dataset_of(uri: str, namespace: str) -> tuple[str, str]:
    """``(namespace, name)`` of an artifact URI, by the OpenLineage naming conventions."""
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        if scheme == "file":
            return "file", rest if rest.startswith("/") else "/" + rest.split("/", 1)[-1]
        authority, _, path = rest.partition("/")
        return f"{scheme}://{authority}", "/" + path
    if uri.startswith("/") or ":" not in uri:
        return "file", uri
    scheme, rest = uri.split(":", 1)
    return scheme, rest


def _dataset(cls: type[Any], namespace: str, name: str, chash: str | None,
             attrs: dict[str, str] | None = None) -> Any:
    facets: dict[str, Any] = {}
    if chash:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(producer=PRODUCER,
            datasetVersion=chash)
    if attrs:
        facets["ledgerflow_artifact"] = LedgerflowArtifactDatasetFacet(producer=PRODUCER,
                                                                       attrs=dict(attrs))
    return cls(namespace=namespace, name=name, facets=facets)


@dataclass(slots=True)
class Namer:
    """Names of jobs and datasets of one run."""

    namespace: str
    pipeline: str

    def result(self, key: str) -> str:
        return f"{self.pipeline}/{key}"

    def job(self, info: TaskInfo) -> str:
        return f"{self.pipeline}.{info.node or info.key}"


@functools.lru_cache(maxsize=1)
def _engine() -> processing_engine_run.ProcessingEngineRunFacet:
    return processing_engine_run.ProcessingEngineRunFacet(producer=PRODUCER,
        version=ledgerflow.__version__, name="ledgerflow", openlineageAdapterVersion=client_version)


def _parent(namer: Namer, parent_id: str) -> parent_run.ParentRunFacet:
    return _parent_facet(namer.namespace, namer.pipeline, parent_id)


@functools.lru_cache(maxsize=64)
def _parent_facet(namespace: str, pipeline: str, parent_id: str) -> parent_run.ParentRunFacet:
    """One facet object per run (facets are only read when events are serialised)."""
    namer = Namer(namespace, pipeline)
    return parent_run.ParentRunFacet(producer=PRODUCER,
        run=parent_run.Run(runId=parent_id),
        job=parent_run.Job(namespace=namer.namespace, name=namer.pipeline),
        root=parent_run.Root(run=parent_run.RootRun(runId=parent_id),
                             job=parent_run.RootJob(namespace=namer.namespace,
                                                    name=namer.pipeline)))


def _task_job(namer: Namer, info: TaskInfo) -> Job:
    return _job(namer.namespace, namer.job(info), info.name, info.code_version)


@functools.lru_cache(maxsize=4096)
def _job(namespace: str, name: str, task: str, code_version: str) -> Job:
    info = TaskInfo(task, name=task, code_version=code_version)
    return Job(namespace=namespace, name=name, facets={
        "jobType": job_type_job.JobTypeJobFacet(producer=PRODUCER, processingType="BATCH",
                                                integration="LEDGERFLOW", jobType="TASK"),
        "ledgerflow_code": LedgerflowCodeJobFacet(producer=PRODUCER, task=info.name,
                                                  codeVersion=info.code_version or None)})


def _inputs(namer: Namer, ups: Sequence[tuple[str, str | None]],
            artifacts: Iterable[Artifact]) -> list[InputDataset]:
    out = [_dataset(InputDataset, namer.namespace, namer.result(k), h) for k, h in ups]
    for direction, uri, chash, attrs in artifacts:
        if direction == "input" and attrs.get("kind") != "model":
            ns, name = dataset_of(uri, namer.namespace)
            out.append(_dataset(InputDataset, ns, name, chash, attrs))
    return out


def _usage(artifacts: Iterable[Artifact]) -> LedgerflowModelUsageRunFacet | None:
    rows = usage_rows(artifacts)
    if not rows:
        return None
    models = []
    cost: float | None = None
    for r in rows:
        entry: dict[str, Any] = {"provider": r.get("provider", ""), "model": r.get("model", ""),
                                 "calls": int(r.get("calls", 0)),
                                 "inputTokens": int(r.get("input_tokens", 0)),
                                 "outputTokens": int(r.get("output_tokens", 0))}
        if "cost_usd" in r:
            entry["costUsd"] = float(r["cost_usd"])
            cost = (cost or 0.0) + entry["costUsd"]
        models.append(entry)
    return LedgerflowModelUsageRunFacet(producer=PRODUCER,
        calls=sum(m["calls"] for m in models), inputTokens=sum(m["inputTokens"] for m in models),
        outputTokens=sum(m["outputTokens"] for m in models), models=models, costUsd=cost)


def start_event(namer: Namer, tracker: Facts, info: TaskInfo, attempt: int,
                ts: float) -> RunEvent:
    """START of an attempt, at its ``running`` commit."""
    parent = run_uuid(tracker)
    return RunEvent(
        eventType=RunState.START, eventTime=_time(ts), producer=PRODUCER,
        run=Run(runId=_uuid(ts, tracker.run_id, info.key, attempt), facets={
            "parent": _parent(namer, parent), "processing_engine": _engine(),
            "ledgerflow_task": LedgerflowTaskRunFacet(producer=PRODUCER,
                runId=tracker.run_id, taskKey=info.key, attempt=attempt,
                itemKey=info.item_key)}),
        job=_task_job(namer, info),
        inputs=_inputs(namer, tracker.upstream_results(info), ()))


def end_event(namer: Namer, tracker: Facts, end: Ended) -> RunEvent:
    """COMPLETE, FAIL or ABORT of an attempt, at its end."""
    info = end.task
    started = end.running_at if end.running_at is not None else (end.started_at or end.ended_at)
    facets: dict[str, Any] = {
        "parent": _parent(namer, run_uuid(tracker)), "processing_engine": _engine(),
        "ledgerflow_task": LedgerflowTaskRunFacet(producer=PRODUCER,
            runId=tracker.run_id, taskKey=info.key, attempt=end.attempt, outcome=end.outcome,
            itemKey=info.item_key, fingerprint=end.fingerprint)}
    if end.outcome != "ok":
        message = f"{end.error_type}: {end.error_message}" if end.error_type \
            else f"{end.outcome}: {end.error_message}"
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(producer=PRODUCER,
            message=message.strip(": ") or end.outcome, programmingLanguage="python",
            stackTrace=end.traceback or None)
    usage = _usage(end.artifacts)
    if usage is not None:
        facets["ledgerflow_modelUsage"] = usage
    outputs: list[OutputDataset] = []
    if end.result_hash is not None:
        outputs.append(_dataset(OutputDataset, namer.namespace, namer.result(info.key),
                                end.result_hash))
    for direction, uri, chash, attrs in end.artifacts:
        if direction == "output":
            ns, name = dataset_of(uri, namer.namespace)
            outputs.append(_dataset(OutputDataset, ns, name, chash, attrs))
    return RunEvent(
        eventType=RunState(_OUTCOME.get(end.outcome, "FAIL")), eventTime=_time(end.ended_at),
        producer=PRODUCER,
        run=Run(runId=_uuid(started, tracker.run_id, info.key, end.attempt), facets=facets),
        job=_task_job(namer, info),
        inputs=_inputs(namer, tracker.upstream_results(info), end.artifacts), outputs=outputs)


def cached_events(namer: Namer, tracker: Facts, info: TaskInfo, attempt: int,
                  ts: float) -> list[RunEvent]:
    """START and COMPLETE of a task whose result was reused (a cache hit), at that time."""
    task = LedgerflowTaskRunFacet(producer=PRODUCER, runId=tracker.run_id, taskKey=info.key,
                                  attempt=attempt,
                                  outcome="cached", itemKey=info.item_key,
                                  fingerprint=info.fingerprint, cachedFrom=info.cached_from)
    rid = _uuid(ts, tracker.run_id, info.key, attempt, "cached")
    out = []
    for kind in (RunState.START, RunState.COMPLETE):
        out.append(RunEvent(
            eventType=kind, eventTime=_time(ts), producer=PRODUCER,
            run=Run(runId=rid, facets={"parent": _parent(namer, run_uuid(tracker)),
                                       "processing_engine": _engine(),
                                       "ledgerflow_task": task}),
            job=_task_job(namer, info),
            inputs=_inputs(namer, tracker.upstream_results(info), ()),
            outputs=[_dataset(OutputDataset, namer.namespace, namer.result(info.key),
                              info.result_hash)] if kind == RunState.COMPLETE else []))
    return out


def run_event(namer: Namer, tracker: Facts, kind: str, ts: float,
              state: str | None = None, reason: str = "") -> RunEvent:
    """START (at creation) or the end of the pipeline run itself."""
    facets: dict[str, Any] = {"processing_engine": _engine(),
                              "ledgerflow_run": LedgerflowRunRunFacet(producer=PRODUCER,
                                  runId=tracker.run_id, target=tracker.target, state=state)}
    if kind == "FAIL" and reason:
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(producer=PRODUCER,
            message=reason, programmingLanguage="python")
    return RunEvent(
        eventType=RunState(kind), eventTime=_time(ts), producer=PRODUCER,
        run=Run(runId=run_uuid(tracker), facets=facets),
        job=Job(namespace=namer.namespace, name=namer.pipeline, facets={
            "jobType": job_type_job.JobTypeJobFacet(producer=PRODUCER, processingType="BATCH",
                                                    integration="LEDGERFLOW",
                                                    jobType="PIPELINE"),
            "ledgerflow_code": LedgerflowCodeJobFacet(producer=PRODUCER, task=namer.pipeline)}))


def events_of(run_id: str, store: RunStore, namespace: str) -> list[RunEvent]:
    """Every event of a finished run, from the ledger (the backfill), in time order."""
    view = store.get_run(run_id)
    events = store.events(run_id)
    tracker, ended, cached = attempts_of(view, store.attempts(run_id), events,
                                         store.lineage(run_id))
    namer = Namer(namespace, tracker.pipeline)
    # (group, time, rank, order): the run's START first, its end last, attempts by time
    timed: list[tuple[int, float, int, int, RunEvent]] = []
    timed.append((0, view.created_at, 0, 0,
                  run_event(namer, tracker, "START", view.created_at)))
    n = 0
    for e in events:
        if e["to_state"] == "running":
            n += 1
            timed.append((1, float(e["ts"]), 0, n,
                          start_event(namer, tracker, tracker.task(e["task_key"]),
                                      int(e["attempt"]), float(e["ts"]))))
    for info, attempt, ts in cached:
        n += 1
        for i, ev in enumerate(cached_events(namer, tracker, info, attempt, ts)):
            timed.append((1, ts, i, n, ev))
    for end in ended:
        n += 1
        timed.append((1, end.ended_at, 1, n, end_event(namer, tracker, end)))
    if view.state in _TERMINAL_RUN and view.ended_at is not None:
        timed.append((2, view.ended_at, 0, 0, run_event(
            namer, tracker, _TERMINAL_RUN[view.state], view.ended_at, view.state, view.reason)))
    timed.sort(key=lambda t: t[:4])
    return [t[4] for t in timed]


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
    if view.state not in _TERMINAL_RUN:
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
        run = self.runs.get(run_id)
        fresh = any(type(r) is RunDefined for r in records)
        if run is None:
            tracker = RunTracker(run_id) if fresh else RunTracker.from_store(run_id, store)
            # a submitted run driven for the first time: its START was not emitted yet
            fresh = fresh or not tracker.tasks
            run = self.runs[run_id] = _Run(tracker, Namer(self.namespace, ""))
        tracker = run.tracker
        ended = tracker.apply(records)
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
                                       rec.ts, tracker.upstream_results(info)))
            elif isinstance(rec, AttemptEnded):
                end = ends.pop((rec.task_key, rec.attempt), None)
                if end is not None:
                    jobs.append(_later(end_event, namer, tracker, end,
                                       tracker.upstream_results(end.task)))
            elif isinstance(rec, RunStateChanged) and rec.state in _TERMINAL_RUN:
                jobs.append(_run_end(namer, tracker, rec))
        for job in jobs:
            self.emitter.put(job)

    def finish(self, run_id: str) -> None:
        """The run stopped driving: wait until its events are out."""
        self.runs.pop(run_id, None)
        self.emitter.drain()

    def close(self) -> None:
        """Emit what is queued and close the client."""
        self.emitter.close()


def _run_end(namer: Namer, tracker: RunTracker, s: RunStateChanged
             ) -> Callable[[], list[RunEvent]]:
    return lambda: [run_event(namer, tracker, _TERMINAL_RUN[s.state], s.at, s.state, s.reason)]


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

    def upstream_results(self, info: TaskInfo) -> list[tuple[str, str | None]]:
        return self.ups
