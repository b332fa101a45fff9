"""Approval gates bound to what is approved, decided from any process (real subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import ledgerflow
from ledgerflow import Approval, context, pipeline, task
from ledgerflow.errors import (
    ApprovalConflictError,
    DefinitionError,
    InputError,
    NotWaitingError,
    StaleDigestError,
)
from tests.waiting import wait_until

FLOW = '''
import os
from ledgerflow import Approval, context, pipeline, task

SIDE = os.environ["SIDE"]

def mark(what):
    with open(SIDE, "a") as fh:
        fh.write(what + "\\n")

@task
def build(n: int) -> list[int]:
    mark("build")
    return list(range(n))

@task(approve=Approval(timeout=float(os.environ.get("GATE_TIMEOUT", "3600")),
                       on_timeout=os.environ.get("ON_TIMEOUT", "fail")))
def publish(xs: list[int], target: str) -> int:
    mark("publish")
    return len(xs)

@task
def after(n: int) -> int:
    mark("after")
    return n + 1

@pipeline
def gated(n: int = 3, target: str = "prod"):
    return after(publish(build(n), target))
'''


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env["SIDE"] = str(tmp_path / "side.log")
    return flow, str(tmp_path / "ledger.duckdb"), env


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def _side(env: dict[str, str]) -> Counter[str]:
    path = Path(env["SIDE"])
    return Counter(path.read_text().split()) if path.exists() else Counter()


def _waiting_run(flow: Path, ledger: str, env: dict[str, str], *extra: str) -> str:
    res = _cli("run", str(flow), "--store", ledger, *extra, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    run_id = res.stdout.split()[1]
    assert f"pipeline approve {run_id} 'publish' --digest" in res.stdout
    return run_id


def _request(run_id: str, ledger: str, env: dict[str, str]) -> dict:
    res = _cli("approvals", run_id, "--store", ledger, "--json", env=env)
    assert res.returncode == 0, res.stderr
    (req,) = json.loads(res.stdout)
    return req


def _status(run_id: str, ledger: str, env: dict[str, str]) -> dict:
    res = _cli("status", run_id, "--store", ledger, "--json", env=env)
    return json.loads(res.stdout)


def test_waiting_approve_with_the_digest_resume_succeeds(project) -> None:
    flow, ledger, env = project
    run_id = _waiting_run(flow, ledger, env)
    status = _status(run_id, ledger, env)
    assert status["state"] == "waiting"
    assert {t["key"]: t["state"] for t in status["tasks"]}["publish"] == "waiting_approval"
    req = _request(run_id, ledger, env)
    assert (req["run_id"], req["task_key"], req["action"]) == (run_id, "publish", "run")
    assert 'target="prod"' in req["summary"] and "build" in req["inputs"]
    stale = _cli("approve", run_id, "publish", "--digest", "abcdef0", "--store", ledger,
                 env=env)
    assert stale.returncode == 2 and req["digest"] in stale.stderr
    ok = _cli("approve", run_id, "publish", "--digest", req["digest"][:10], "--reason",
              "looks right", "--as", "ana", "--store", ledger, env=env)
    assert ok.returncode == 0, ok.stderr
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 0, res.stderr
    assert _status(run_id, ledger, env)["state"] == "succeeded"
    assert _side(env) == Counter({"build": 1, "publish": 1, "after": 1})
    text = _cli("status", run_id, "--store", ledger, env=env).stdout
    assert "approval: publish run approved by ana: looks right" in text
    lineage = json.loads(_cli("lineage", run_id, "--store", ledger, "--task", "publish",
                              "--json", env=env).stdout)
    assert any(r["direction"] == "approval" and r["attrs"]["decided_by"] == "ana"
               for r in lineage)


def test_reject_fails_the_task_and_its_downstream(project) -> None:
    flow, ledger, env = project
    run_id = _waiting_run(flow, ledger, env)
    res = _cli("reject", run_id, "publish", "--reason", "wrong target", "--store", ledger,
               "--resume", env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    tasks = {t["key"]: t for t in _status(run_id, ledger, env)["tasks"]}
    assert tasks["publish"]["state"] == "failed"
    assert tasks["publish"]["error"].startswith("rejected: wrong target")
    assert tasks["after"]["state"] == "upstream_failed"
    assert _side(env)["publish"] == 0


def test_an_expired_deadline_is_applied_by_status_from_another_process(project) -> None:
    flow, ledger, env = project
    env = {**env, "GATE_TIMEOUT": "5"}     # long enough for the run to print its gate
    run_id = _waiting_run(flow, ledger, env)
    (req,) = ledgerflow.approvals(run_id, store=ledger)
    time.sleep(max(0.0, req["deadline"] + 0.5 - time.time()))     # the deadline has passed
    tasks = {t["key"]: t for t in _status(run_id, ledger, env)["tasks"]}
    assert tasks["publish"]["state"] == "failed"
    assert tasks["publish"]["error"].startswith("expired: no decision before the deadline")
    late = _cli("approve", run_id, "publish", "--digest", "abcdef0", "--store", ledger, env=env)
    assert late.returncode == 2 and "not waiting" in late.stderr
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 1
    view = _status(run_id, ledger, env)
    assert view["state"] == "failed" and _side(env)["publish"] == 0


def test_a_killed_waiting_driver_approval_from_elsewhere_resume(project) -> None:
    flow, ledger, env = project
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", str(flow), "--store",
                             ledger, "--wait-approvals"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    run_id = proc.stdout.readline().split()[1]
    wait_until(lambda: _cli("approvals", run_id, "--store", ledger, "--json",
                            env=env).stdout.strip() not in ("", "[]"), what="the request")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    req = _request(run_id, ledger, env)
    assert _cli("approve", run_id, "publish", "--digest", req["digest"][:12], "--store",
                ledger, env=env).returncode == 0
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 0, res.stderr
    assert _side(env) == Counter({"build": 1, "publish": 1, "after": 1})


def test_wait_approvals_picks_up_a_decision(project) -> None:
    flow, ledger, env = project
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", str(flow), "--store",
                             ledger, "--wait-approvals"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    run_id = proc.stdout.readline().split()[1]
    wait_until(lambda: _cli("approvals", run_id, "--store", ledger, "--json",
                            env=env).stdout.strip() not in ("", "[]"), what="the request")
    req = _request(run_id, ledger, env)
    _cli("approve", run_id, "publish", "--digest", req["digest"][:12], "--store", ledger,
         env=env)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert _side(env) == Counter({"build": 1, "publish": 1, "after": 1})


def test_approve_and_reject_racing_exactly_one_wins(project) -> None:
    flow, ledger, env = project
    run_id = _waiting_run(flow, ledger, env)
    digest = _request(run_id, ledger, env)["digest"]
    decide = [["approve", run_id, "publish", "--digest", digest[:12]],
              ["reject", run_id, "publish", "--reason", "no"]] * 2
    procs = [subprocess.Popen([sys.executable, "-m", "ledgerflow", *args, "--store", ledger],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for args in decide]
    outs = [p.communicate(timeout=60) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2, 2, 2], outs
    (winner,) = [ledgerflow.get_run(run_id, store=ledger).approvals()[0]["state"]]
    assert winner in ("approved", "rejected")


def test_bad_input_to_approve(project) -> None:
    flow, ledger, env = project
    run_id = _waiting_run(flow, ledger, env)
    digest = _request(run_id, ledger, env)["digest"]
    with pytest.raises(ledgerflow.RunNotFoundError):
        ledgerflow.approve("no-such-run", "publish", digest=digest, store=ledger)
    with pytest.raises(InputError, match="has no task 'nope'"):
        ledgerflow.approve(run_id, "nope", digest=digest, store=ledger)
    with pytest.raises(NotWaitingError, match="it is succeeded"):
        ledgerflow.approve(run_id, "build", digest=digest, store=ledger)
    with pytest.raises(InputError, match="too short"):
        ledgerflow.approve(run_id, "publish", digest=digest[:3], store=ledger)
    with pytest.raises(StaleDigestError):
        ledgerflow.approve(run_id, "publish", digest="0" * 12, store=ledger)
    with pytest.raises(InputError, match="needs a reason"):
        ledgerflow.reject(run_id, "publish", reason="", store=ledger)
    ledgerflow.approve(run_id, "publish", digest=digest, store=ledger)
    with pytest.raises(NotWaitingError, match="was approved"):
        ledgerflow.reject(run_id, "publish", reason="too late", store=ledger)
    with pytest.raises(DefinitionError, match="on_timeout must be one of"):
        Approval(on_timeout="approve")
    with pytest.raises(ApprovalConflictError):
        ledgerflow.get_run(run_id, store=ledger).store.decide(
            run_id, "publish", digest, "rejected", "x", "again")


@task
def sent(to: str) -> str:
    ctx = context()
    body = ctx.step("compose", lambda: f"hello {to} at {COMPOSED.append(to) or len(COMPOSED)}")
    decision = ctx.approval("send", {"to": to, "body": body})
    return f"{body}: {decision.decision}"


COMPOSED: list[str] = []


@pipeline
def mail(to: str = "ops"):
    return sent(to)


def test_in_task_gate_is_bound_to_its_payload(tmp_path: Path) -> None:
    store = str(tmp_path / "l.duckdb")
    run = mail.run(store=store, executor="threads")
    assert run.state == "waiting"                       # returns instead of blocking
    (req,) = run.approvals(pending_only=True)
    assert req["action"] == "send" and '"to": "ops"' in req["summary"]
    assert "approval(s) waiting" in run._repr_html_()
    # a decision for another payload (the same action) is not this request's approval
    other = ledgerflow.approval.action_digest(run.run_id, "sent", sent.version, "send",
                                              {"to": "ops", "body": "changed"})
    assert other != req["digest"]
    run.store.decide(run.run_id, "sent", other, "approved", "mallory", "")
    again = ledgerflow.resume(run.run_id, store=store, executor="threads")
    assert again.state == "waiting"                     # still waiting: not approved
    run.approve("sent", digest=req["digest"], reason="ok")
    done = ledgerflow.resume(run.run_id, store=store, executor="threads")
    assert done.state == "succeeded" and done.result().endswith(": approved")
    assert COMPOSED == ["ops"]                           # the step before the gate ran once
    outcomes = [a["outcome"] for a in done.attempts("sent")]
    assert outcomes == ["waiting", "ok"]


@task(approve=True)
def each(i: int) -> int:
    return i


@pipeline
def many(n: int = 10_000):
    return each.map(list(range(n)))


def test_a_gate_on_a_big_fan_out_asks_once_per_item(tmp_path: Path) -> None:
    store = str(tmp_path / "l.duckdb")
    run = many.run(store=store, executor="inline")
    assert run.state == "waiting"
    pending = ledgerflow.approvals(run.run_id, store=store)
    assert len(pending) == 10_000 and len({r["digest"] for r in pending}) == 10_000
    res = subprocess.run([sys.executable, "-m", "ledgerflow", "approvals", run.run_id,
                          "--store", store], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and len(res.stdout.splitlines()) < 60     # listed compactly
    assert "and 9950 more" in res.stdout


@task(approve=True)
def guarded(x: int) -> int:
    return x


@pipeline
def one_gate(x: int = 1):
    return guarded(x)


def test_readers_see_the_refusal_the_driver_then_records(tmp_path: Path) -> None:
    """One refusal rule: before a driver applies a rejection, readers already see the task
    ``failed`` with the reason the driver then records (the ledger still says waiting)."""
    store = str(tmp_path / "l.duckdb")
    run = one_gate.run(store=store, executor="inline")
    assert run.state == "waiting"
    run.reject("guarded", reason="not today", by="ana")
    seen = run.status().tasks["guarded"]                 # a reader, before any driver
    assert seen.state == "failed"
    assert seen.error == "rejected: not today (by ana); applied when the run is resumed"
    done = ledgerflow.resume(run.run_id, store=store, executor="inline")
    assert done.state == "failed"
    row = done.status().tasks["guarded"]
    assert (row.state, row.error) == ("failed", "rejected: not today (by ana)")
    assert [a["state"] for a in done.approvals()] == ["rejected"]
