"""Approvals as the people who use them need them (issue 33 #2-#5), through the CLI in real
subprocesses: what an approver sees, who decides, deadlines on time with notifications,
one rule for an in-task rejection and for a payload that changes on every attempt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FLOW = '''
import json, os
from pathlib import Path
from ledgerflow import Approval, context, pipeline, task

@task
def build(n: int) -> list[int]:
    return list(range(n))

@task(approve=Approval(timeout=float(os.environ.get("GATE_TIMEOUT", "3600")),
                       approvers=os.environ.get("APPROVERS", "").split(",") if
                       os.environ.get("APPROVERS") else [],
                       note="check the target before it goes out"))
def publish(xs: list[int], target: str, api_key: str) -> int:
    return len(xs)

@pipeline
def gated(n: int = 3, target: str = "prod", api_key: str = "k-123"):
    return publish(build(n), target, api_key)

@task
def pay() -> str:
    amount = json.loads(Path(os.environ["DATA"]).read_text())["amount"]
    Path(os.environ["SIDE"]).open("a").write("past the gate? ")
    d = context().approval("pay", {"amount": amount, "to": "acme",
                                   "token": os.environ.get("PAY_TOKEN", "")})
    Path(os.environ["SIDE"]).open("a").write(d.decision + "\\n")
    if not d.approved:
        raise RuntimeError(f"payment {d.decision}: {d.reason}")
    return "paid"

@pipeline
def paying():
    return pay()

@task
def stamp() -> str:
    import time
    context().approval("send", {"to": "ops", "at": time.time()})
    return "sent"

@pipeline
def stamping():
    return stamp()

@task
def each_mail() -> list[str]:
    return [context().approval("send", {"to": to}).decision for to in ("ops", "dev")]

@pipeline
def mailing():
    return each_mail()
'''


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    (tmp_path / "data.json").write_text('{"amount": 5}')
    # the notify plugin, registered the way an installed plugin is (an entry point)
    info = tmp_path / "ep" / "ledgerflow_notify_test-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ledgerflow-notify-test\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text("[ledgerflow]\nnotify = ledgerflow_notify\n")
    events = tmp_path / "events.jsonl"
    hook = tmp_path / "hook.py"
    hook.write_text("import sys\nopen(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(SIDE=str(tmp_path / "side.log"), DATA=str(tmp_path / "data.json"),
               PYTHONPATH=os.pathsep.join([str(tmp_path / "ep"), str(ROOT / "plugins")]),
               LEDGERFLOW_NOTIFY_COMMAND=f"{sys.executable} {hook} {events}",
               LEDGERFLOW_APPROVERS=str(tmp_path / "approvers"))
    return flow, str(tmp_path / "ledger.duckdb"), env


def _cli(*args: str, env: dict[str, str], user: int | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=180,
                          user=user, cwd="/tmp" if user is not None else None)


def _run(flow: Path, pipe: str, ledger: str, env: dict[str, str], *extra: str) -> str:
    res = _cli("run", f"{flow}:{pipe}", "--store", ledger, *extra, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    return res.stdout.split()[1]


def _requests(run_id: str, ledger: str, env: dict[str, str]) -> list[dict]:
    res = _cli("approvals", run_id, "--store", ledger, "--json", env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _events(env: dict[str, str]) -> list[dict]:
    path = Path(env["LEDGERFLOW_NOTIFY_COMMAND"].split()[-1])
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
        if path.exists() else []


def test_an_approver_sees_the_values_note_approvers_and_deadline(project) -> None:
    flow, ledger, env = project
    env = {**env, "APPROVERS": "ana,root"}
    run_id = _run(flow, "gated", ledger, env, "-p", "target=staging-3f9a2c77e1",
                  "-p", "api_key=sk-live-0123456789")
    text = _cli("approvals", run_id, "--store", ledger, env=env).stdout
    assert "xs = [0, 1, 2]" in text                       # the upstream's value, not a hash
    assert 'target = "staging-3f9a2c77e1"' in text
    assert "api_key = ***" in text and "sk-live" not in text    # a secret-named argument
    assert "note: check the target before it goes out" in text
    assert "approvers: ana, root" in text and "deadline: " in text and "(then expired)" in text
    assert "input build: result " in text
    (req,) = _requests(run_id, ledger, env)
    assert req["arguments"] == {"xs": "[0, 1, 2]", "target": '"staging-3f9a2c77e1"',
                                "api_key": "***"}
    assert list(req["inputs"]) == ["build"] and req["note"].startswith("check the target")
    assert req["approvers"] == ["ana", "root"] and req["changed"] is None
    assert [e["event"] for e in _events(env)] == ["requested"]
    assert _events(env)[0]["request"]["arguments"]["xs"] == "[0, 1, 2]"
    ok = _cli("approve", run_id, "publish", "--digest", req["digest"][:12], "--store", ledger,
              env=env)
    assert ok.returncode == 0, ok.stderr
    assert "publish: approved by root" in ok.stdout       # the OS user running the command
    decided = [e for e in _events(env) if e["event"] == "decided"]
    assert len(decided) == 1 and decided[0]["decision"]["decided_by"] == "root"


def test_a_known_key_value_is_masked_wherever_it_appears(project) -> None:
    flow, ledger, env = project
    env = {**env, "PAY_TOKEN": "tok-9f8e7d6c5b4a"}
    run_id = _run(flow, "paying", ledger, env)
    text = _cli("approvals", run_id, "--store", ledger, env=env).stdout
    assert "amount = 5" in text and 'to = "acme"' in text and "token = ***" in text
    assert "tok-9f8e7d6c5b4a" not in text
    (req,) = _requests(run_id, ledger, env)
    assert "tok-9f8e7d6c5b4a" not in json.dumps(req)


def test_what_changed_since_the_last_request_and_one_rule_for_a_rejection(project) -> None:
    """An in-task rejection goes to the code that asked, in the drive that sees it as in
    every resume (here the code fails on it); a new request after the data changed says
    what changed since the rejected one."""
    flow, ledger, env = project
    run_id = _run(flow, "paying", ledger, env)
    res = _cli("reject", run_id, "pay", "--reason", "wrong amount", "--store", ledger,
               "--resume", env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert status["state"] == "failed"
    assert "payment rejected: wrong amount" in status["tasks"][0]["error"]
    assert Path(env["SIDE"]).read_text().count("rejected") == 1     # the code got it
    again = _cli("resume", run_id, "--store", ledger, env=env)      # the same payload
    assert again.returncode == 1, again.stdout + again.stderr
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert "payment rejected: wrong amount" in status["tasks"][0]["error"]
    assert Path(env["SIDE"]).read_text().count("rejected") == 2     # the same, again
    Path(env["DATA"]).write_text('{"amount": 7}')
    third = _cli("resume", run_id, "--store", ledger, env=env)
    assert third.returncode == 3, third.stdout + third.stderr        # asks anew
    text = _cli("approvals", run_id, "--store", ledger, env=env).stdout
    assert "amount = 7" in text
    assert "(rejected): amount: 5 -> 7" in text
    (req,) = _requests(run_id, ledger, env)
    assert req["changed"] == [{"field": "amount", "before": "5", "after": "7"}]


def test_a_reader_sees_a_rejected_in_task_gate_as_handed_to_the_code(project) -> None:
    flow, ledger, env = project
    run_id = _run(flow, "paying", ledger, env)
    assert _cli("reject", run_id, "pay", "--reason", "no", "--store", ledger,
                env=env).returncode == 0
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    (row,) = status["tasks"]
    assert status["state"] == "waiting" and row["state"] == "ready"
    assert "approval() returns that decision" in row["error"]


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_one_action_asked_for_several_payloads_in_turn_is_not_refused(project,
                                                                       executor: str) -> None:
    """Approving ``send`` to ops, then to dev (one attempt each): the second request is a
    new payload asked after using the first approval, not an unstable payload."""
    flow, ledger, env = project
    run_id = _run(flow, "mailing", ledger, env, "--executor", executor)
    for to in ("ops", "dev"):
        (req,) = _requests(run_id, ledger, env)
        assert req["arguments"] == {"to": f'"{to}"'}
        assert _cli("approve", run_id, "each_mail", "--digest", req["digest"][:12],
                    "--store", ledger, env=env).returncode == 0
        res = _cli("resume", run_id, "--store", ledger, "--executor", executor, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    out = _cli("result", run_id, "--store", ledger, env=env).stdout
    assert "approved" in out


@pytest.mark.parametrize("executor", ["processes"])
def test_an_unstable_payload_is_refused_on_processes_too(project, executor: str) -> None:
    flow, ledger, env = project
    run_id = _run(flow, "stamping", ledger, env, "--executor", executor)
    (req,) = _requests(run_id, ledger, env)
    assert _cli("approve", run_id, "stamp", "--digest", req["digest"][:12], "--store",
                ledger, env=env).returncode == 0
    res = _cli("resume", run_id, "--store", ledger, "--executor", executor, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert "changes on every attempt (at: " in status["tasks"][0]["error"]


def test_an_expired_deadline_reads_the_same_everywhere_and_notifies_once(project) -> None:
    flow, ledger, env = project
    env = {**env, "GATE_TIMEOUT": "3"}
    run_id = _run(flow, "gated", ledger, env)
    (asked,) = _events(env)                 # the driver announced it, with its deadline
    time.sleep(max(0.0, asked["request"]["deadline"] + 0.5 - time.time()))
    runs = json.loads(_cli("runs", "--store", ledger, "--json", env=env).stdout)
    assert [r["state"] for r in runs if r["run_id"] == run_id] == ["failed"]
    (listed,) = [r for r in runs if r["run_id"] == run_id]
    assert "waiting_approval" not in listed["counts"], listed      # counts agree with it
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert status["state"] == "failed"
    assert status["tasks"][1]["error"].startswith("expired: no decision before the deadline")
    text = _cli("status", run_id, "--store", ledger, env=env).stdout
    assert "waiting for approvals" not in text
    assert _cli("approvals", run_id, "--store", ledger, env=env).stdout.strip() == \
        "no approvals waiting"
    assert [e["event"] for e in _events(env)] == ["requested", "expired"]   # once each
    assert _events(env)[1]["decision"]["decision"] == "expired"
    res = _cli("resume", run_id, "--store", ledger, env=env)
    assert res.returncode == 1
    assert [e["event"] for e in _events(env)] == ["requested", "expired"]




def test_a_waiting_driver_applies_the_deadline_on_time(project) -> None:
    flow, ledger, env = project
    env = {**env, "GATE_TIMEOUT": "3"}
    res = _cli("run", f"{flow}:gated", "--store", ledger, "--wait-approvals", env=env)
    assert res.returncode == 1, res.stdout + res.stderr       # expired: no one was asked
    (asked, expired) = _events(env)
    assert (asked["event"], expired["event"]) == ("requested", "expired")
    # the driver itself recorded the expiry: no reader had touched the run yet
    run_id = res.stdout.split()[1]
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert status["state"] == "failed"


def test_a_waiting_driver_hands_an_in_task_rejection_to_the_code(project) -> None:
    """The same rule in the drive that sees the rejection as in a resume."""
    flow, ledger, env = project
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", f"{flow}:paying",
                             "--store", ledger, "--wait-approvals"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().split()[1]
        deadline = time.time() + 120
        while not _events(env) and time.time() < deadline:     # the driver asked
            time.sleep(0.2)
        assert _cli("reject", run_id, "pay", "--reason", "not now", "--store", ledger,
                    env=env).returncode == 0
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert "payment rejected: not now" in status["tasks"][0]["error"]
