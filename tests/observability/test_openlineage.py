"""OpenLineage: events per attempt through the client's file and HTTP transports, checked
against the spec as openlineage-python ships it; a backfill equals the live events."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import ledgerflow
from ledgerflow import context, pipeline, task
from ledgerflow.cli import main
from ledgerflow_observability import genai, openlineage

pytest.importorskip("openlineage.client", reason="needs the 'observability' extra")

from .olschema import check_event


@task
def source(n: int) -> int:
    return n


@task(retries=1, retry_delay=0, cache=False)
def flaky(x: int, folder: str) -> int:
    ctx = context()
    data = Path(folder, "in.txt").read_bytes()
    ctx.record_input(str(Path(folder, "in.txt")), hashlib.sha256(data).hexdigest(), rows="1")
    if ctx.attempt == 1:
        raise ValueError("first attempt fails")
    with genai.model_call("fake", "fake-model") as call:
        call.usage(40, 8, cost_usd=0.002)
    out = Path(folder, "out.txt")
    out.write_text(f"{x}\n")
    ctx.record_output(str(out), hashlib.sha256(out.read_bytes()).hexdigest())
    return x + 1


@task(cache=False)
def shard(i: int) -> int:
    return i * 10


@task(cache=False)
def total(xs: list[int]) -> int:
    return sum(xs)


@task(cache=False)
def bad(x: int) -> int:
    raise RuntimeError("always broken")


@pipeline
def flow(folder: str, n: int = 2):
    s = source(n)
    return flaky(s, folder), total(shard.map(list(range(n)))), bad(s)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _key(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True)


@pytest.fixture
def folder(tmp_path: Path) -> str:
    (tmp_path / "in.txt").write_text("hello\n")
    return str(tmp_path)


@pytest.fixture
def live(tmp_path: Path, ledger: str, folder: str) -> Iterator[tuple[Any, Any, Path]]:
    """Two runs of ``flow`` (the first fills the cache); the second emits to a file."""
    first = flow.run(store=ledger, folder=folder)
    path = tmp_path / "events.jsonl"
    openlineage.enable(f"file:{path}", namespace="tests")
    try:
        run = flow.run(store=ledger, folder=folder)
    finally:
        openlineage.disable()
    yield first, run, path


def test_events_per_attempt_are_valid_openlineage_with_lineage_from_the_ledger(
        live: tuple[Any, Any, Path], folder: str) -> None:
    first, run, path = live
    assert run.state == "failed"
    docs = _lines(path)
    for doc in docs:
        check_event(doc)
    view = run.status()
    by_job: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by_job.setdefault(d["job"]["name"], []).append(d)

    pipe_start, pipe_end = by_job["flow"]
    assert (pipe_start["eventType"], pipe_end["eventType"]) == ("START", "FAIL")
    assert pipe_start["run"]["runId"] == pipe_end["run"]["runId"]
    parent_id = pipe_start["run"]["runId"]
    assert pipe_end["run"]["facets"]["ledgerflow_run"]["runId"] == run.run_id
    for d in docs:
        if d["job"]["name"] != "flow":
            assert d["run"]["facets"]["parent"]["run"]["runId"] == parent_id
            assert d["run"]["facets"]["parent"]["job"] == {"namespace": "tests", "name": "flow",
                                                           "facets": {}}

    # the retried task: START/FAIL of attempt 1, START/COMPLETE of attempt 2
    f = by_job["flow.flaky"]
    assert [d["eventType"] for d in f] == ["START", "FAIL", "START", "COMPLETE"]
    assert f[0]["run"]["runId"] == f[1]["run"]["runId"] != f[2]["run"]["runId"] == \
        f[3]["run"]["runId"]
    assert "first attempt fails" in f[1]["run"]["facets"]["errorMessage"]["message"]
    assert f[1]["outputs"] == []
    done = f[3]
    assert done["run"]["facets"]["ledgerflow_task"]["attempt"] == 2
    assert done["run"]["facets"]["ledgerflow_task"]["fingerprint"] == \
        view.tasks["flaky"].fingerprint
    assert done["job"]["facets"]["ledgerflow_code"]["codeVersion"] == \
        view.tasks["flaky"].code_version
    lineage = {(r["task_key"], r["direction"], r["uri"]): r for r in run.lineage()}
    inputs = {(i["namespace"], i["name"]): i["facets"] for i in done["inputs"]}
    assert inputs[("tests", "flow/source")]["version"]["datasetVersion"] == \
        view.tasks["source"].result_hash
    src_file = str(Path(folder, "in.txt"))
    assert inputs[("file", src_file)]["version"]["datasetVersion"] == \
        lineage[("flaky", "input", src_file)]["content_hash"]
    assert inputs[("file", src_file)]["ledgerflow_artifact"]["attrs"] == {"rows": "1"}
    outputs = {(o["namespace"], o["name"]): o["facets"] for o in done["outputs"]}
    assert outputs[("tests", "flow/flaky")]["version"]["datasetVersion"] == \
        view.tasks["flaky"].result_hash
    out_file = str(Path(folder, "out.txt"))
    assert outputs[("file", out_file)]["version"]["datasetVersion"] == \
        hashlib.sha256(Path(out_file).read_bytes()).hexdigest()
    usage = done["run"]["facets"]["ledgerflow_modelUsage"]
    assert (usage["calls"], usage["inputTokens"], usage["outputTokens"], usage["costUsd"]) == (
        1, 40, 8, 0.002)
    assert usage["models"][0]["provider"] == "fake"
    assert ("file", "fake/fake-model") not in inputs and not any(
        i["name"].startswith("model:") or i["namespace"] == "model" for i in done["inputs"])

    # the cached task: START and COMPLETE at the cache hit, naming the run it came from
    c = by_job["flow.source"]
    assert [d["eventType"] for d in c] == ["START", "COMPLETE"]
    assert c[1]["run"]["facets"]["ledgerflow_task"]["outcome"] == "cached"
    assert c[1]["run"]["facets"]["ledgerflow_task"]["cachedFrom"] == first.run_id
    assert c[1]["outputs"][0]["facets"]["version"]["datasetVersion"] == \
        view.tasks["source"].result_hash

    # a fan-in reads every child of the fan-out, with their hashes
    (t_start, t_done) = by_job["flow.total"]
    assert t_start["eventType"] == "START"
    assert [(i["name"], i["facets"]["version"]["datasetVersion"]) for i in t_done["inputs"]] == [
        (f"flow/{k}", view.tasks[k].result_hash) for k in ("shard[0]", "shard[1]")]
    assert len(by_job["flow.shard"]) == 4      # one job for the fan-out's two children

    (b_start, b_fail) = by_job["flow.bad"]
    assert b_start["eventType"] == "START"
    assert b_fail["eventType"] == "FAIL"
    assert "RuntimeError" in b_fail["run"]["facets"]["errorMessage"]["message"]
    assert "Traceback" in b_fail["run"]["facets"]["errorMessage"]["stackTrace"]

    # event times are the ledger's: START at the running commit, the end at the attempt's end
    running = [e["ts"] for e in run.events("flaky") if e["to_state"] == "running"]
    assert [d["eventTime"] for d in f if d["eventType"] == "START"] == [
        ledgerflow_time(t) for t in running]


def ledgerflow_time(ts: float) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


def test_a_backfill_of_a_finished_run_equals_the_events_emitted_live(
        live: tuple[Any, Any, Path], tmp_path: Path, ledger: str) -> None:
    _, run, path = live
    out = tmp_path / "backfill.jsonl"
    env = {"LEDGERFLOW_OPENLINEAGE_NAMESPACE": "tests"}
    res = CliRunner().invoke(main, ["lineage", run.run_id, "--export", "openlineage", str(out),
                                    "--store", ledger], env=env)
    assert res.exit_code == 0, res.output
    back = _lines(out)
    assert f"wrote {len(back)} openlineage item(s)" in res.output
    assert sorted(map(_key, back)) == sorted(map(_key, _lines(path)))
    for doc in back:
        check_event(doc)
    res = CliRunner().invoke(main, ["lineage", run.run_id, "--export", "openlineage", "-",
                                    "--store", ledger], env=env)
    assert res.exit_code == 0
    assert sorted(res.output.splitlines()) == sorted(map(_key, back))


def test_a_run_that_has_not_finished_is_not_exported(ledger: str, tmp_path: Path,
                                                     folder: str) -> None:
    run_id = ledgerflow.control.submit(flow, store=ledger, folder=folder)
    res = CliRunner().invoke(main, ["lineage", run_id, "--export", "openlineage",
                                    str(tmp_path / "x.jsonl"), "--store", ledger])
    assert res.exit_code == 2
    assert "only a finished run can be exported" in res.output
    assert not (tmp_path / "x.jsonl").exists()


def test_the_check_refuses_what_the_spec_does_not_allow(live: tuple[Any, Any, Path]) -> None:
    doc = _lines(live[2])[1]
    for broken in (
            {**doc, "eventType": "FINISHED"},
            {**doc, "run": {**doc["run"], "runId": "not-a-uuid"}},
            {**doc, "job": {**doc["job"], "owner": "me"}},
            {k: v for k, v in doc.items() if k != "eventTime"}):
        with pytest.raises((ValueError, TypeError, AssertionError)):
            check_event(broken)
    facet = doc["run"]["facets"]["ledgerflow_task"]
    bad = {**doc, "run": {**doc["run"], "facets": {**doc["run"]["facets"],
                                                   "ledgerflow_task": {**facet, "attempt": -1}}}}
    with pytest.raises(Exception, match="-1"):
        check_event(bad)


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, json.loads(body)))
        self.send_response(201)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


@task(cache=False)
def small(x: int) -> int:
    return x


@pipeline
def tiny():
    return small(1)


def test_events_reach_an_http_backend(ledger: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Collector.received = []
    try:
        openlineage.enable(f"http://127.0.0.1:{server.server_port}")
        try:
            run = tiny.run(store=ledger, executor="inline")
        finally:
            openlineage.disable()
    finally:
        server.shutdown()
        server.server_close()
    assert run.state == "succeeded"
    # emitted before the run returned (the driver waits for its queue at the end)
    assert [(p, d["eventType"], d["job"]["name"]) for p, d in _Collector.received] == [
        ("/api/v1/lineage", "START", "tiny"), ("/api/v1/lineage", "START", "tiny.small"),
        ("/api/v1/lineage", "COMPLETE", "tiny.small"), ("/api/v1/lineage", "COMPLETE", "tiny")]
    for _, doc in _Collector.received:
        check_event(doc)


def test_events_are_emitted_only_after_the_commit_that_holds_them(ledger: str) -> None:
    from openlineage.client import OpenLineageClient
    from openlineage.client.transport.transport import Transport

    from ledgerflow_stores.duckdb import DuckDBStore

    seen: list[tuple[str, bool]] = []

    class Checking(Transport):
        kind = "checking"

        def emit(self, event: Any) -> None:
            facets = event.run.facets
            task_facet = facets.get("ledgerflow_task")
            if task_facet is None:
                return
            fresh = DuckDBStore(ledger)     # another reader: journal + file as committed
            rid = task_facet.runId
            if event.eventType.value == "START":
                durable = any(e["to_state"] == "running" and e["attempt"] == task_facet.attempt
                              for e in fresh.events(rid, task_facet.taskKey))
            else:
                durable = any(a["attempt"] == task_facet.attempt
                              for a in fresh.attempts(rid, task_facet.taskKey))
            seen.append((event.eventType.value, durable))

    openlineage.enable(client=OpenLineageClient(transport=Checking()))
    try:
        run = tiny.run(store=ledger, executor="threads")
    finally:
        openlineage.disable()
    assert run.state == "succeeded"
    assert seen == [("START", True), ("COMPLETE", True)]


@task
def fx(folder: str) -> str:
    """Reads an S3 object and a local file, writes a local file (recorded as lineage)."""
    ctx = context()
    ctx.record_input("s3://fx-rates/daily/eur.json", "e" * 64)
    ctx.record_input(str(Path(folder, "in.txt")), "i" * 64)
    out = Path(folder, "fx.txt")
    out.write_text("1.08\n")
    ctx.record_output(out.as_uri(), "o" * 64)       # file:///...
    ctx.record_output("postgres://db:5432/shop.public.rates", "p" * 64)
    return "ok"


@pipeline
def rates(folder: str):
    return fx(folder)


@pytest.fixture
def fx_events(tmp_path: Path, ledger: str, folder: str
              ) -> Iterator[tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]]:
    """A run of ``rates`` and a second, cached one, each emitting to its own file."""
    paths = [tmp_path / "first.jsonl", tmp_path / "cached.jsonl"]
    runs = []
    for path in paths:
        openlineage.enable(f"file:{path}", namespace="tests")
        try:
            runs.append(rates.run(store=ledger, folder=folder, executor="threads"))
        finally:
            openlineage.disable()
    assert runs[1].status().tasks["fx"].cached_from == runs[0].run_id
    yield runs[1], _lines(paths[0]), _lines(paths[1])


def _datasets(doc: dict[str, Any], side: str) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in doc[side]}


def test_dataset_names_follow_the_openlineage_naming_spec(
        fx_events: tuple[Any, list[dict[str, Any]], list[dict[str, Any]]], folder: str) -> None:
    _, first, _ = fx_events
    (done,) = [d for d in first if d["job"]["name"] == "rates.fx"
               and d["eventType"] == "COMPLETE"]
    check_event(done)
    # S3: namespace s3://bucket, name the key without a leading slash; files: 'file' and
    # the absolute path (also for a file:// URI); databases: db.schema.table
    assert _datasets(done, "inputs") == {("s3://fx-rates", "daily/eur.json"),
                                         ("file", str(Path(folder, "in.txt")))}
    assert _datasets(done, "outputs") == {("tests", "rates/fx"),
                                          ("file", str(Path(folder, "fx.txt"))),
                                          ("postgres://db:5432", "shop.public.rates")}


def test_a_cache_hit_keeps_the_datasets_of_the_attempt_it_reuses(
        fx_events: tuple[Any, list[dict[str, Any]], list[dict[str, Any]]], ledger: str,
        tmp_path: Path) -> None:
    run, first, cached = fx_events
    (done,) = [d for d in first if d["job"]["name"] == "rates.fx"
               and d["eventType"] == "COMPLETE"]
    hit = [d for d in cached if d["job"]["name"] == "rates.fx"]
    assert [d["eventType"] for d in hit] == ["START", "COMPLETE"]
    for d in hit:
        check_event(d)
    start, complete = hit
    assert complete["run"]["facets"]["ledgerflow_task"]["outcome"] == "cached"
    # a "latest lineage" view keeps the file edges: the same inputs and outputs
    assert _datasets(start, "inputs") == _datasets(complete, "inputs") == \
        _datasets(done, "inputs")
    assert _datasets(complete, "outputs") == _datasets(done, "outputs")
    versions = {(o["namespace"], o["name"]): o["facets"]["version"]["datasetVersion"]
                for o in complete["outputs"]}
    assert versions[("postgres://db:5432", "shop.public.rates")] == "p" * 64
    # the backfill of the cached run says the same
    out = tmp_path / "backfill.jsonl"
    res = CliRunner().invoke(main, ["lineage", run.run_id, "--export", "openlineage",
                                    str(out), "--store", ledger],
                             env={"LEDGERFLOW_OPENLINEAGE_NAMESPACE": "tests"})
    assert res.exit_code == 0, res.output
    assert sorted(map(_key, _lines(out))) == sorted(map(_key, cached))
