"""Workers never claim a run that only waits for a decision, and claim in a fair order
(issue 33): real ``pipeline worker`` processes on a real PostgreSQL server.

* a run waiting for an approval is claimed by its first drive only; the newer
  submitted runs are all driven meanwhile (each claimed once);
* once a decision is recorded (``pipeline approve``), a worker claims the run once
  more and it succeeds;
* a gate whose deadline passes is applied by a worker with no reader involved:
  the run ends as the deadline rule says (``expired``: the task and the run fail).

The tests read the ledger with plain SQL only: a reader (``status``, ``approvals``)
would apply a passed deadline itself.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import wait_until

from .test_postgres_crash import CLI, env_for, q

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.slow]

#: The deadline of the expiring gate: long enough for its first drive to end waiting
#: on a loaded machine (the drive that reaches it then applies it: still one claim).
DEADLINE = 8

FLOW = textwrap.dedent(f"""
    from ledgerflow import Approval, pipeline, task

    @task
    def work(i: int, tag: str = "") -> int:
        return i

    @task(approve=True)
    def publish(tag: str) -> str:
        return f"sent {{tag}}"

    @task(approve=Approval(timeout={DEADLINE}, on_timeout="fail"))
    def publish_soon(tag: str) -> str:
        return f"sent {{tag}}"

    @pipeline
    def plain(n: int = 2, tag: str = ""):
        return work.map(list(range(n)), tag=tag)     # a tag per run: nothing cached

    @pipeline
    def gated(tag: str = ""):
        return publish(tag)

    @pipeline
    def expiring(tag: str = ""):
        return publish_soon(tag)
""")

SUBMIT = ("import sys; from ledgerflow.control import submit\n"
          "for name, tag in zip(sys.argv[3::2], sys.argv[4::2]):\n"
          "    print(submit(sys.argv[1] + ':' + name, params={'tag': tag}, store=sys.argv[2]))")


def _submit(url: str, tmp_path: Path, *runs: tuple[str, str]) -> list[str]:
    """Submit ``(pipeline, tag)`` runs in this order (oldest first); their run ids."""
    flow = tmp_path / "flow.py"
    if not flow.exists():
        flow.write_text(FLOW)
    args = [a for name_tag in runs for a in name_tag]
    out = subprocess.run([sys.executable, "-c", SUBMIT, str(flow), url, *args],
                         env=env_for(tmp_path), capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    assert len(set(ids)) == len(runs), out.stdout
    return ids


def _worker(url: str, tmp_path: Path, name: str) -> subprocess.Popen[str]:
    with open(tmp_path / f"{name}.log", "w") as log:     # the child keeps its own copy
        return subprocess.Popen([*CLI, "worker", "--store", url, "--poll", "0.2",
                                 "--exit-idle", "120"],
                                stdout=log, stderr=subprocess.STDOUT, text=True,
                                env=env_for(tmp_path))


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def _run(url: str, run_id: str) -> tuple[Any, ...]:
    """(state, token) of the run as folded into the tables."""
    return q(url, "SELECT state, token FROM runs WHERE run_id = %s", [run_id])[0]


def _claims(tmp_path: Path, run_id: str, *names: str) -> list[str]:
    """The 'claimed' lines of ``run_id`` in the workers' logs."""
    return [ln for n in names for ln in (tmp_path / f"{n}.log").read_text().splitlines()
            if f"run {run_id} claimed" in ln]


def _logs(tmp_path: Path, *names: str) -> str:
    return "\n".join(f"--- {n}\n" + (tmp_path / f"{n}.log").read_text() for n in names)


@pytest.mark.timeout(300)
def test_a_waiting_run_is_claimed_once_and_the_newer_runs_are_all_driven(
        pg_url: str, tmp_path: Path) -> None:
    waiting, *newer = _submit(pg_url, tmp_path, ("gated", "g"), ("plain", "1"),
                              ("plain", "2"), ("plain", "3"))
    workers = [_worker(pg_url, tmp_path, "w1"), _worker(pg_url, tmp_path, "w2")]
    try:
        wait_until(lambda: [_run(pg_url, r)[0] for r in newer] == ["succeeded"] * 3,
                   timeout=120, what=lambda: ("the three newer runs to succeed",
                                              q(pg_url, "SELECT run_id, state, token FROM runs"),
                                              _logs(tmp_path, "w1", "w2")))
        # its first drive is its only one: it stops at the gate, and no worker claims it
        # again while nobody decides (it used to be claimed over and over)
        wait_until(lambda: _run(pg_url, waiting) == ("waiting", 2), timeout=60,
                   what=lambda: ("the gated run to wait", _run(pg_url, waiting),
                                 _logs(tmp_path, "w1", "w2")))
        assert len(_claims(tmp_path, waiting, "w1", "w2")) == 1, _logs(tmp_path, "w1", "w2")
        assert q(pg_url, "SELECT task_key, state FROM tasks WHERE run_id = %s",
                 [waiting]) == [("publish", "waiting_approval")]
        # each newer run was claimed once (token 2) and ran all its tasks
        for r in newer:
            assert _run(pg_url, r) == ("succeeded", 2)
            assert len(_claims(tmp_path, r, "w1", "w2")) == 1
        assert q(pg_url, "SELECT count(*) FROM attempts WHERE run_id = ANY(%s)",
                 [newer]) == [(6,)]
    finally:
        _stop(workers)


@pytest.mark.timeout(300)
def test_an_approval_has_a_worker_claim_the_waiting_run_which_succeeds(
        pg_url: str, tmp_path: Path) -> None:
    (run_id,) = _submit(pg_url, tmp_path, ("gated", "a"))
    workers = [_worker(pg_url, tmp_path, "w1")]
    try:
        wait_until(lambda: f"run {run_id} ended waiting" in _logs(tmp_path, "w1"),
                   timeout=90, what=lambda: ("the drive to end waiting", _logs(tmp_path, "w1")))
        wait_until(lambda: _run(pg_url, run_id) == ("waiting", 2), timeout=30,
                   what="the run to be waiting")
        (digest,) = q(pg_url, "SELECT digest FROM approval_requests WHERE run_id = %s",
                      [run_id])[0]
        ok = subprocess.run([*CLI, "approve", run_id, "publish", "--digest", digest[:12],
                             "--reason", "looks right", "--store", pg_url],
                            env=env_for(tmp_path), capture_output=True, text=True, timeout=90)
        assert ok.returncode == 0, ok.stderr
        # the decision makes it claimable: claimed once more (token 3) and driven to the end
        wait_until(lambda: _run(pg_url, run_id)[0] == "succeeded", timeout=90,
                   what=lambda: ("the approved run to succeed", _run(pg_url, run_id),
                                 _logs(tmp_path, "w1")))
        assert _run(pg_url, run_id) == ("succeeded", 3), _logs(tmp_path, "w1")
        assert len(_claims(tmp_path, run_id, "w1")) == 2, _logs(tmp_path, "w1")
        assert q(pg_url, "SELECT decision, reason FROM approval_decisions WHERE run_id = %s",
                 [run_id]) == [("approved", "looks right")]
        assert q(pg_url, "SELECT state FROM tasks WHERE run_id = %s", [run_id]) == [
            ("succeeded",)]
    finally:
        _stop(workers)


@pytest.mark.timeout(300)
def test_a_passed_deadline_is_applied_by_a_worker_without_any_reader(
        pg_url: str, tmp_path: Path) -> None:
    run_id, later = _submit(pg_url, tmp_path, ("expiring", "x"), ("plain", "4"))
    workers = [_worker(pg_url, tmp_path, "w1")]
    try:
        # the newer run is not held back by the one waiting for its deadline
        wait_until(lambda: _run(pg_url, later)[0] == "succeeded", timeout=90,
                   what=lambda: ("the later run to succeed", _logs(tmp_path, "w1")))
        wait_until(lambda: _run(pg_url, run_id)[0] == "failed", timeout=DEADLINE + 90,
                   what=lambda: ("the run past its deadline to fail", _run(pg_url, run_id),
                                 _logs(tmp_path, "w1")))
        # the deadline rule: the request expired (decided by the deadline, journaled by
        # the worker's drive), its task failed with that reason, the run failed
        assert q(pg_url, "SELECT decision, decided_by FROM approval_decisions "
                 "WHERE run_id = %s", [run_id]) == [("expired", "ledgerflow (deadline)")]
        ((state, error),) = q(pg_url, "SELECT state, error FROM tasks WHERE run_id = %s",
                              [run_id])
        assert state == "failed" and error.startswith("expired: no decision before the "
                                                      "deadline"), error
        # claimed by its first drive and, at most, once more when the deadline passed
        # (never over and over while it waited)
        claims = _claims(tmp_path, run_id, "w1")
        assert _run(pg_url, run_id)[1] == len(claims) + 1 <= 3, _logs(tmp_path, "w1")
    finally:
        _stop(workers)
