"""A decision counts only as the store records it: a planted decision is damage, not an approval.

The DuckDB store writes each decision file with a CRC-32 bound to its run and request;
a hand-written file, or a journal line carrying a decision without its checksum, leaves
the run waiting on resume, and ``pipeline doctor`` names it with the fix. A real
``pipeline approve`` from another process still lets the resume go on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

FLOW = '''
import os
from ledgerflow import pipeline, task

def mark(what):
    with open(os.environ["SIDE"], "a") as fh:
        fh.write(what + "\\n")

@task
def build(n: int) -> list[int]:
    mark("build")
    return list(range(n))

@task(approve=True)
def publish(xs: list[int]) -> int:
    mark("publish")
    return len(xs)

@pipeline
def gated(n: int = 3):
    return publish(build(n))
'''


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.fixture
def waiting(tmp_path: Path) -> tuple[str, str, str, dict[str, str]]:
    """A run waiting at its gate: (run id, ledger, the request's digest, env)."""
    (tmp_path / "flow.py").write_text(FLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env["SIDE"] = str(tmp_path / "side.log")
    ledger = str(tmp_path / "ledger.duckdb")
    res = _cli("run", str(tmp_path / "flow.py"), "--store", ledger, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    run_id = res.stdout.split()[1]
    (req,) = json.loads(_cli("approvals", run_id, "--store", ledger, "--json",
                             env=env).stdout)
    return run_id, ledger, req["digest"], env


def _side(env: dict[str, str]) -> Counter[str]:
    path = Path(env["SIDE"])
    return Counter(path.read_text().split()) if path.exists() else Counter()


def _state(run_id: str, ledger: str, env: dict[str, str]) -> tuple[str, str]:
    doc = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    return doc["state"], {t["key"]: t["state"] for t in doc["tasks"]}["publish"]


def _approve_and_resume(run_id: str, ledger: str, digest: str, env: dict[str, str]) -> None:
    ok = _cli("approve", run_id, "publish", "--digest", digest[:12], "--as", "ana",
              "--store", ledger, env=env)
    assert ok.returncode == 0, ok.stderr
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _state(run_id, ledger, env) == ("succeeded", "succeeded")
    assert _side(env) == Counter({"build": 1, "publish": 1})


def test_a_hand_written_decision_file_is_damage_not_an_approval(waiting) -> None:
    run_id, ledger, digest, env = waiting
    folder = Path(ledger + ".d") / "runs" / run_id / "decisions"
    folder.mkdir(parents=True, exist_ok=True)
    planted = folder / f"{digest}.json"
    planted.write_text(json.dumps({"task_key": "publish", "digest": digest,
                                   "decision": "approved", "decided_by": "mallory",
                                   "reason": "", "decided_at": time.time()}))
    (req,) = json.loads(_cli("approvals", run_id, "--store", ledger, "--json",
                             env=env).stdout)
    assert req.get("decision") in (None, "")
    doctor = _cli("doctor", "--store", ledger, env=env)
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert str(planted) in doctor.stdout and "remove it, then decide again" in doctor.stdout
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    assert _state(run_id, ledger, env) == ("waiting", "waiting_approval")
    assert _side(env) == Counter({"build": 1})
    # the planted file holds the request's place: a real decision says so, and how to fix it
    refused = _cli("approve", run_id, "publish", "--digest", digest[:12], "--store", ledger,
                   env=env)
    assert refused.returncode == 2 and str(planted) in refused.stderr, refused.stderr
    assert "remove it" in refused.stderr
    planted.unlink()
    _approve_and_resume(run_id, ledger, digest, env)
    assert _cli("doctor", "--store", ledger, env=env).returncode == 0


def test_a_decision_line_without_its_checksum_is_damage_not_an_approval(waiting) -> None:
    run_id, ledger, digest, env = waiting
    (segment,) = (Path(ledger + ".d") / "journals").glob(f"{run_id}.*.jsonl")
    line = json.dumps([["Q", "publish", digest, "approved", "mallory", "", time.time()]])
    with open(segment, "a") as fh:
        fh.write(line + "\n")
    doctor = _cli("doctor", "--store", ledger, env=env)
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert "an approval decision without its checksum" in doctor.stdout, doctor.stdout
    (req,) = json.loads(_cli("approvals", run_id, "--store", ledger, "--json",
                             env=env).stdout)
    assert req.get("decision") in (None, "")
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    assert _state(run_id, ledger, env) == ("waiting", "waiting_approval")
    assert _side(env) == Counter({"build": 1})
    _approve_and_resume(run_id, ledger, digest, env)


def test_a_decision_file_copied_from_another_request_does_not_check(waiting,
                                                                    tmp_path: Path) -> None:
    """The checksum is bound to the run and the request: a real decision file of one
    run, copied to another run's request, is no decision there."""
    run_id, ledger, digest, env = waiting
    other = _cli("run", str(tmp_path / "flow.py"), "--store", ledger, "-p", "n=4", env=env)
    assert other.returncode == 3, other.stderr
    other_id = other.stdout.split()[1]
    (req,) = json.loads(_cli("approvals", other_id, "--store", ledger, "--json",
                             env=env).stdout)
    assert _cli("approve", other_id, "publish", "--digest", req["digest"][:12], "--store",
                ledger, env=env).returncode == 0
    runs = Path(ledger + ".d") / "runs"
    real = runs / other_id / "decisions" / f"{req['digest']}.json"
    (runs / run_id / "decisions").mkdir(parents=True, exist_ok=True)
    copied = runs / run_id / "decisions" / f"{digest}.json"
    copied.write_bytes(real.read_bytes())
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    assert _state(run_id, ledger, env) == ("waiting", "waiting_approval")
    doctor = _cli("doctor", "--store", ledger, env=env)
    assert doctor.returncode == 2 and str(copied) in doctor.stdout, doctor.stdout


def test_an_unchecked_file_of_a_request_the_journal_decided_is_no_problem(waiting) -> None:
    """A decision file an older ledgerflow wrote (no checksum) after its decision reached
    the journal: doctor mentions it, and it is not a problem."""
    run_id, ledger, digest, env = waiting
    _approve_and_resume(run_id, ledger, digest, env)
    path = Path(ledger + ".d") / "runs" / run_id / "decisions" / f"{digest}.json"
    doc, _ = path.read_text().rsplit("\t", 1)
    path.write_text(doc)            # as the release before the checksum wrote it
    doctor = _cli("doctor", "--store", ledger, env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert str(path) in doctor.stdout and "changes nothing" in doctor.stdout
