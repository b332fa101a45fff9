"""A tool call's approver may edit its arguments (issue 33): the edit is checked against the
tool's schema, recorded with the decision in every store, bound to the request's digest, and
the tool runs with it on the resume; bad edits are refused with the ledger untouched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import pipeline, task
from ledgerflow.errors import InputError, StaleDigestError
from ledgerflow_agents import MockModel, agent_task, tool
from tests.agents.test_agent_subprocess import _calls, _cli, _project, _requests, _side
from tests.readme.readme import blocks, commands
from tests.waiting import wait_until


@tool
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


def _adder(mock: MockModel) -> Any:
    @agent_task(model=mock, tools=[add], approve=["add"], retries=0)
    def adder(question: str) -> str:
        return question

    @pipeline
    def sums():
        return adder("what is 1 + 2?")

    return sums


def _turns() -> list[dict[str, Any]]:
    return [{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
            {"text": "the sum is in the tool result"}]


@pytest.fixture(scope="module")
def pg_server() -> Iterator[Any]:
    from tests.postgres.pgserver import started_or_skip
    server = started_or_skip()
    yield server
    server.destroy()


@pytest.fixture(params=["duckdb", "memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> str:
    """A ledger of each store kind (PostgreSQL: a fresh schema on a real server)."""
    if request.param == "duckdb":
        return str(tmp_path / "ledger.duckdb")
    if request.param == "memory":
        return f"memory:edits-{os.getpid()}-{tmp_path.name}"
    monkeypatch.setenv("LEDGERFLOW_BLOB_DIR", str(tmp_path / "blobs"))
    server = request.getfixturevalue("pg_server")
    return str(server.create_schema(f"lf_edit_{os.getpid()}_{tmp_path.name[-8:]}".lower()
                                    .replace("-", "_")))


def test_an_edited_approval_runs_the_tool_with_the_edit_in_every_store(ledger: str) -> None:
    mock = MockModel(turns=_turns())
    sums = _adder(mock)
    run = sums.run(store=ledger)
    assert run.status().state == "waiting"
    (req,) = ledgerflow.approvals(run.run_id, store=ledger)
    assert req["action"] == "tool:add" and req["editable"] is True

    # a stale digest still refuses, edit or not: the decision names one request
    with pytest.raises(StaleDigestError):
        ledgerflow.approve(run.run_id, "adder", digest="0" * 12, store=ledger,
                           arguments={"a": 5, "b": 3})
    dec = ledgerflow.approve(run.run_id, "adder", digest=req["digest"][:12], store=ledger,
                             arguments={"a": 5, "b": 3})
    assert dec["arguments"] == {"a": 5, "b": 3} and dec["digest"] == req["digest"]

    done = ledgerflow.resume(run.run_id, store=ledger, pipeline=sums)
    assert done.status().state == "succeeded"
    told = [m["content"] for m in mock.requests[-1]["request"]["messages"]
            if m["role"] == "tool"]
    assert len(told) == 1 and told[0].endswith("8") and '{"a":5,"b":3}' in told[0]
    (call,) = done.tool_calls()
    assert (call["tool"], call["outcome"]) == ("add", "ok")
    assert call["edit"]["original"] == {"a": 1, "b": 2}
    assert call["edit"]["arguments"] == {"a": 5, "b": 3}
    (row,) = done.approvals()
    assert row["state"] == "approved" and row["edit"]["arguments"] == {"a": 5, "b": 3}
    # read back by a fresh handle: the edit is in the ledger, not in this process
    again = ledgerflow.get_run(run.run_id, store=ledger)
    assert [c["edit"]["arguments"] for c in again.tool_calls()] == [{"a": 5, "b": 3}]


def test_a_bad_edit_is_refused_and_nothing_is_recorded(tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.duckdb")
    run = _adder(MockModel(turns=_turns())).run(store=ledger)
    (req,) = ledgerflow.approvals(run.run_id, store=ledger)
    prefix = req["digest"][:12]
    cases = [({"a": 5, "c": 3}, "unknown argument(s) c"),
             ({"a": 5}, "missing argument(s) b"),
             ({"a": "five", "b": 3}, "a must be integer"),
             ({"a": True, "b": 3}, "a must be integer")]
    for arguments, why in cases:
        with pytest.raises(InputError, match=re.escape(why)) as info:
            ledgerflow.approve(run.run_id, "adder", digest=prefix, store=ledger,
                               arguments=arguments)
        assert "{a: integer, b: integer}" in (info.value.hint or "")
    handle = ledgerflow.get_run(run.run_id, store=ledger)
    assert [a["state"] for a in handle.approvals()] == ["pending"]
    assert handle.store.approval_decisions(run.run_id) == []


def test_editing_a_task_gate_is_refused(tmp_path: Path) -> None:
    @task(approve=True)
    def publish(text: str) -> str:
        return f"sent {text}"

    @pipeline
    def gated(text: str = "hello"):
        return publish(text)

    ledger = str(tmp_path / "ledger.duckdb")
    run = gated.run(store=ledger)
    (req,) = ledgerflow.approvals(run.run_id, store=ledger)
    assert req["editable"] is False
    with pytest.raises(InputError, match="is not a tool call: its arguments cannot be edited"):
        ledgerflow.approve(run.run_id, "publish", digest=req["digest"][:12], store=ledger,
                           arguments={"text": "bye"})
    assert [a["state"] for a in ledgerflow.get_run(run.run_id, store=ledger).approvals()] \
        == ["pending"]


# -- the CLI, in real subprocesses -------------------------------------------------------------

@pytest.mark.subprocess
def test_cli_approve_with_edited_arguments_then_resume(tmp_path: Path) -> None:
    flow, ledger, env = _project(tmp_path, [_calls("one"), {"text": "done"}],
                                 approve="append_line")
    res = _cli("run", str(flow), "-p", f"out={tmp_path / 'out'}", "--store", ledger, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    run_id = res.stdout.split()[1]
    listed = _cli("approvals", run_id, "--store", ledger, env=env)
    assert "--arguments" in listed.stdout, listed.stdout
    (req,) = json.loads(_cli("approvals", run_id, "--store", ledger, "--json", env=env).stdout)
    assert req["editable"] is True and req["state"] == "pending"

    # bad input: exit 2, the cause and the fix, nothing recorded
    for bad, why in [("{not json", "--arguments is not JSON"),
                     ('["two"]', "must be a JSON object"),
                     ('{"txt": "two"}', "unknown argument(s) txt"),
                     ('{"text": 2}', "text must be string")]:
        no = _cli("approve", run_id, "worker", "--digest", req["digest"][:12], "--arguments",
                  bad, "--store", ledger, env=env)
        assert no.returncode == 2 and why in no.stderr and "Hint:" in no.stderr, no.stderr
    (still,) = json.loads(_cli("approvals", run_id, "--store", ledger, "--json",
                               env=env).stdout)
    assert still["digest"] == req["digest"] and still["state"] == "pending"

    # the README's example, as written (RUN_ID, PREFIX replaced)
    (block,) = [b for b in blocks("Approval gates", "bash") if "--arguments" in b]
    (approve,) = [c for c in commands(block) if c[:2] == ["pipeline", "approve"]]
    argv = [w.replace("RUN_ID", run_id).replace("PREFIX", req["digest"][:12])
            for w in approve[1:]]
    ok = _cli(*argv, "--store", ledger, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert 'with edited arguments {"text": "two"}' in ok.stdout
    assert _side(tmp_path) == ["two"]                # the tool ran once, with the edit
    reqs = _requests(tmp_path)
    told = [m["content"] for m in reqs[-1]["request"]["messages"] if m["role"] == "tool"]
    assert len(told) == 1 and told[0].endswith("appended two"), told
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert status["state"] == "succeeded"

    (shown,) = json.loads(_cli("approvals", run_id, "--store", ledger, "--json",
                               env=env).stdout)
    assert shown["state"] == "approved" and shown["digest"] == req["digest"]
    assert shown["edit"]["original"] == {"text": "one"}
    assert shown["edit"]["arguments"] == {"text": "two"}
    text = _cli("approvals", run_id, "--store", ledger, env=env).stdout
    assert 'original: {"text": "one"}' in text and 'edited:   {"text": "two"}' in text
    calls = ledgerflow.get_run(run_id, store=ledger).tool_calls()
    assert [(c["outcome"], c["edit"]["arguments"]) for c in calls] == [("ok", {"text": "two"})]


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_waiting_driver_picks_up_an_edited_decision(tmp_path: Path, kind: str,
                                                       request: pytest.FixtureRequest) -> None:
    flow, ledger, env = _project(tmp_path, [_calls("one"), {"text": "done"}],
                                 approve="append_line")
    if kind == "postgres":
        name = f"lf_wait_{os.getpid()}_{tmp_path.name[-8:]}".lower().replace("-", "_")
        ledger = str(request.getfixturevalue("pg_server").create_schema(name))
        env["LEDGERFLOW_BLOB_DIR"] = str(tmp_path / "blobs")
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", str(flow), "-p",
                             f"out={tmp_path / 'out'}", "--store", ledger, "--wait-approvals"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().split()[1]
        wait_until(lambda: _cli("approvals", run_id, "--store", ledger, "--json",
                                env=env).stdout.strip() not in ("", "[]"), timeout=60,
                   what="the tool call's request")
        (req,) = json.loads(_cli("approvals", run_id, "--store", ledger, "--json",
                                 env=env).stdout)
        ok = _cli("approve", run_id, "worker", "--digest", req["digest"][:12], "--arguments",
                  '{"text": "three"}', "--store", ledger, env=env)
        assert ok.returncode == 0, ok.stderr
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, out + err
    assert _side(tmp_path) == ["three"]
    told = [m["content"] for m in _requests(tmp_path)[-1]["request"]["messages"]
            if m["role"] == "tool"]
    assert len(told) == 1 and told[0].endswith("appended three"), told
