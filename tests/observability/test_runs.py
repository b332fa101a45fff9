"""The observers' picture of a run: one tracker per run for every observer, the core's view."""

from __future__ import annotations

from typing import Any

import pytest

from ledgerflow import context, hookimpl, pipeline, task
from ledgerflow.plugins import get_plugin_manager
from ledgerflow_observability import openlineage, otel, prometheus

pytest.importorskip("opentelemetry.sdk", reason="needs the 'observability' extra")
pytest.importorskip("openlineage.client", reason="needs the 'observability' extra")


@task
def base(n: int) -> int:
    return n


@task(retries=1, retry_delay=0, cache=False)
def twice(x: int) -> int:
    if context().attempt == 1:
        raise ValueError("first attempt fails")
    return x + 1


@task(cache=False)
def part(i: int) -> int:
    return i


@task(cache=False)
def broken(xs: list[int]) -> int:
    raise RuntimeError("no")


@pipeline
def shapes(n: int = 3):
    b = base(n)
    return twice(b), broken(part.map(list(range(n))))


class Look:
    """At the end of a drive (before the observers let go of the run): what they hold."""

    def __init__(self) -> None:
        self.trackers: list[Any] = []

    @hookimpl(tryfirst=True)
    def ledgerflow_run_finish(self, run_id: str, state: str) -> None:
        from ledgerflow_observability import _openlineage, _otel, _runs
        self.trackers = [_runs.TRACKERS.get(run_id)]
        for obs in (otel.SWITCH.observer, openlineage.SWITCH.observer):
            impl = obs._impl
            assert isinstance(impl, (_otel.Tracing, _openlineage.Lineage))
            self.trackers.append(impl.runs[run_id].tracker)


def test_every_observer_shares_one_tracker_holding_the_cores_view(tmp_path: Any,
                                                                   ledger: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    shapes.run(store=ledger, executor="threads")       # fills the cache of base
    look = Look()
    pm = get_plugin_manager()
    pm.register(look, name="look")
    otel.enable(TracerProvider())
    openlineage.enable(f"file:{tmp_path / 'ev.jsonl'}")
    prometheus.enable(tmp_path / "m.prom")
    try:
        run = shapes.run(store=ledger, executor="threads")
    finally:
        for mod in (otel, openlineage, prometheus):
            mod.disable()
        pm.unregister(look)
    assert run.state == "failed"
    tracker, *others = look.trackers
    assert tracker is not None and all(o is tracker for o in others)
    from ledgerflow_observability import _runs
    assert _runs.TRACKERS.get(run.run_id) is None        # let go when the drive stopped
    # the picture is the core's projection of the records: the same rows a reader gets
    stored = run.status().tasks
    assert set(tracker.tasks) == set(stored)
    for key, row in stored.items():
        mine = tracker.tasks[key]
        assert (mine.state, mine.attempts, mine.result_hash, mine.fingerprint,
                mine.cached_from, mine.error, mine.upstream) == (
            row.state, row.attempts, row.result_hash, row.fingerprint, row.cached_from,
            row.error, row.upstream), key
    assert stored["base"].cached_from is not None and stored["twice"].attempts == 2
    assert (tracker.state, tracker.pipeline) == ("failed", "shapes")
