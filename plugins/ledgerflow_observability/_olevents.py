"""OpenLineage events of a run: attempts, cache hits and the run itself, live or backfilled.

Live and backfill events come from the same builders (:func:`start_event`,
:func:`end_event`, :func:`cached_events`, :func:`run_event`), fed the same
facts (:mod:`ledgerflow_observability._runs`), so a backfill of a run
(:func:`events_of`) equals what was emitted while it ran. Imported only with
openlineage-python.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from openlineage.client import __version__ as client_version
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    parent_run,
    processing_engine_run,
)
from openlineage.client.uuid import generate_static_uuid

import ledgerflow
from ledgerflow.store import RunStore
from ledgerflow.views import TaskRow

from ._olfacets import (
    PRODUCER,
    LedgerflowArtifactDatasetFacet,
    LedgerflowCodeJobFacet,
    LedgerflowModelUsageRunFacet,
    LedgerflowRunRunFacet,
    LedgerflowTaskRunFacet,
)
from ._olnames import Namer, dataset_of
from ._runs import Artifact, Ended, Reused, attempts_of
from .genai import usage_rows

#: What the event builders read of a run (a tracker, or a snapshot of one).
Facts = Any

TERMINAL_RUN = {"succeeded": "COMPLETE", "failed": "FAIL", "cancelled": "ABORT"}
_OUTCOME = {"ok": "COMPLETE", "error": "FAIL", "timeout": "FAIL", "lost": "FAIL",
            "cancelled": "ABORT"}


def _time(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


def _uuid(ts: float, *parts: object) -> str:
    data = "\x00".join(str(p) for p in parts).encode()
    return str(generate_static_uuid(datetime.fromtimestamp(ts, timezone.utc), data))


def run_uuid(tracker: Facts) -> str:
    """The OpenLineage run id of a ledgerflow run (stable: creation time + run id)."""
    return _uuid(tracker.created_at, "ledgerflow-run", tracker.run_id)



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


def _task_job(namer: Namer, info: TaskRow) -> Job:
    return _job(namer.namespace, namer.job(info), info.task_name, info.code_version)


@functools.lru_cache(maxsize=4096)
def _job(namespace: str, name: str, task: str, code_version: str) -> Job:
    return Job(namespace=namespace, name=name, facets={
        "jobType": job_type_job.JobTypeJobFacet(producer=PRODUCER, processingType="BATCH",
                                                integration="LEDGERFLOW", jobType="TASK"),
        "ledgerflow_code": LedgerflowCodeJobFacet(producer=PRODUCER, task=task,
                                                  codeVersion=code_version or None)})


def _inputs(namer: Namer, ups: Sequence[tuple[str, str | None]],
            artifacts: Iterable[Artifact]) -> list[InputDataset]:
    out = [_dataset(InputDataset, namer.namespace, namer.result(k), h) for k, h in ups]
    for direction, uri, chash, attrs in artifacts:
        if direction == "input" and attrs.get("kind") != "model":
            ns, name = dataset_of(uri)
            out.append(_dataset(InputDataset, ns, name, chash, attrs))
    return out


def _outputs(artifacts: Iterable[Artifact]) -> list[OutputDataset]:
    out = []
    for direction, uri, chash, attrs in artifacts:
        if direction == "output":
            ns, name = dataset_of(uri)
            out.append(_dataset(OutputDataset, ns, name, chash, attrs))
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


def start_event(namer: Namer, tracker: Facts, info: TaskRow, attempt: int,
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
    outputs.extend(_outputs(end.artifacts))
    return RunEvent(
        eventType=RunState(_OUTCOME.get(end.outcome, "FAIL")), eventTime=_time(end.ended_at),
        producer=PRODUCER,
        run=Run(runId=_uuid(started, tracker.run_id, info.key, end.attempt), facets=facets),
        job=_task_job(namer, info),
        inputs=_inputs(namer, tracker.upstream_results(info), end.artifacts), outputs=outputs)


def cached_events(namer: Namer, tracker: Facts, info: TaskRow, attempt: int,
                  ts: float, artifacts: Sequence[Artifact] = ()) -> list[RunEvent]:
    """START and COMPLETE of a task whose result was reused (a cache hit), at that time,
    with the datasets of the attempt it reuses (``artifacts``)."""
    task = LedgerflowTaskRunFacet(producer=PRODUCER, runId=tracker.run_id, taskKey=info.key,
                                  attempt=attempt,
                                  outcome="cached", itemKey=info.item_key,
                                  fingerprint=info.fingerprint, cachedFrom=info.cached_from)
    rid = _uuid(ts, tracker.run_id, info.key, attempt, "cached")
    facets = {"parent": _parent(namer, run_uuid(tracker)), "processing_engine": _engine(),
              "ledgerflow_task": task}
    inputs = _inputs(namer, tracker.upstream_results(info), artifacts)
    outputs = [_dataset(OutputDataset, namer.namespace, namer.result(info.key),
                        info.result_hash), *_outputs(artifacts)]
    return [RunEvent(eventType=kind, eventTime=_time(ts), producer=PRODUCER,
                     run=Run(runId=rid, facets=facets), job=_task_job(namer, info),
                     inputs=inputs, outputs=outputs if kind == RunState.COMPLETE else [])
            for kind in (RunState.START, RunState.COMPLETE)]


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
                                         store.lineage(run_id), Reused(store))
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
    for info, attempt, ts, arts in cached:
        n += 1
        for i, ev in enumerate(cached_events(namer, tracker, info, attempt, ts, arts)):
            timed.append((1, ts, i, n, ev))
    for end in ended:
        n += 1
        timed.append((1, end.ended_at, 1, n, end_event(namer, tracker, end)))
    if view.state in TERMINAL_RUN and view.ended_at is not None:
        timed.append((2, view.ended_at, 0, 0, run_event(
            namer, tracker, TERMINAL_RUN[view.state], view.ended_at, view.state, view.reason)))
    timed.sort(key=lambda t: t[:4])
    return [t[4] for t in timed]

