"""The first hour's rough edges (issue 30, item 8) still open, in real ``pipeline`` processes.

A garbage ledger gets the fix ``pipeline doctor`` gives from every command; a read-only
ledger is refused before a run line; the progress bar draws each frame from one reading
of the counts; ``cancel`` says what it did and refuses a run no process drives; a run's
root cause is one line in a pipe; an agent task's function that returns no prompt is
named in its error (one attempt); an import that fails on a ledgerflow error keeps its fix.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

FLOW = '''
import os, time
from ledgerflow import context, pipeline, task

@task
def items(n: int) -> list[int]:
    return list(range(n))

@task
def nap(x: int) -> int:
    time.sleep(float(os.environ.get("NAP", "0")))
    return x

@pipeline
def naps(n: int = 3):
    return nap.map(items(n))

@task
def boom(x: int) -> int:
    raise ValueError("a long reason: " + "the quick brown fox jumps over the lazy dog " * 4)

@pipeline
def broken(n: int = 1):
    return boom(n)

@task
def send(n: int) -> str:
    context().approval("send", {"n": n})
    return "sent"

@pipeline
def gated(n: int = 1):
    return send(n)
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _cli(*args: str, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env or _env(), cwd=cwd, timeout=240)


def _said(res: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """The Error: and Hint: lines of a refusal (the text after them)."""
    lines = res.stderr.strip().splitlines()
    error = next(ln for ln in lines if ln.startswith("Error: "))
    hint = next(ln for ln in lines if ln.startswith("Hint: "))
    return error[len("Error: "):], hint[len("Hint: "):]


def _fix(doctor: subprocess.CompletedProcess[str]) -> str:
    """The fix of the one problem ``pipeline doctor`` found."""
    lines = doctor.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("PROBLEM"))
    return lines[at + 1].strip().removeprefix("fix: ")


@pytest.fixture
def flow(tmp_path: Path) -> Path:
    path = tmp_path / "flow.py"
    path.write_text(FLOW)
    return path


def _run_json(flow: Path, target: str, ledger: str, *args: str) -> dict:
    res = _cli("run", f"{flow}:{target}", "--store", ledger, "--executor", "inline",
               "--json", *args)
    assert res.stdout, res.stderr
    return json.loads(res.stdout)


# -- a garbage ledger: one fix, whoever is asked -----------------------------------------

@pytest.mark.parametrize("journals", [True, False], ids=["overwritten-ledger", "foreign-file"])
def test_a_garbage_ledger_gets_doctors_fix_from_every_command(flow: Path, tmp_path: Path,
                                                              journals: bool) -> None:
    ledger = str(tmp_path / "ledger.duckdb")
    run_id = _run_json(flow, "naps", ledger)["run_id"] if journals else "20260101-000000-abcdef"
    Path(ledger).write_bytes(os.urandom(64 * 1024))      # past any header size
    before = Path(ledger).read_bytes()
    doctor = _cli("doctor", "--store", ledger)
    assert doctor.returncode == 2 and doctor.stdout.count("PROBLEM") == 1, doctor.stdout
    fix = _fix(doctor)
    assert ("pipeline repair" in fix) is journals        # the journals still hold its runs
    for args in (["runs"], ["status", run_id], ["run", f"{flow}:naps"], ["resume", run_id]):
        res = _cli(*args, "--store", ledger)
        assert res.returncode == 2, (args, res.stderr)
        error, hint = _said(res)
        assert hint == fix and ledger in error, (args, error, hint, fix)
        assert res.stdout == ""                          # no run line, no table
    assert Path(ledger).read_bytes() == before           # nothing written to it
    if journals:                                         # and the fix works
        assert _cli("repair", "--store", ledger).returncode == 0
        doc = json.loads(_cli("status", run_id, "--store", ledger, "--json").stdout)
        assert doc["state"] == "succeeded" and len(doc["tasks"]) == 4


# -- a read-only ledger: refused before the run line --------------------------------------

def _read_only(folder: Path, argv: list[str]) -> list[str]:
    """``argv`` run with ``folder`` read-only: a read-only bind mount for root (whom
    permissions do not stop), the folder's write bits dropped for anyone else."""
    if os.geteuid() != 0:
        return argv
    script = (f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && "
              'exec "$@"')
    wrap = ["unshare", "-m", "sh", "-c", script, "sh"]
    if shutil.which("unshare") is None or subprocess.run(
            [*wrap, "true"], capture_output=True).returncode != 0:
        pytest.skip("root that cannot bind-mount read-only: no way to make a folder so")
    return [*wrap, *argv]


def test_a_read_only_ledger_is_refused_before_the_run_line(flow: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    ledger = str(folder / "ledger.duckdb")
    run_id = _run_json(flow, "broken", ledger)["run_id"]
    entries = [folder, *folder.rglob("*")]
    modes = {p: p.stat().st_mode for p in entries}
    if os.geteuid() != 0:
        for p in entries:
            p.chmod(0o500 if p.is_dir() else 0o400)
    try:
        cli = [sys.executable, "-m", "ledgerflow"]
        for args in (["run", f"{flow}:naps"], ["resume", run_id]):
            res = subprocess.run(_read_only(folder, [*cli, *args, "--store", ledger,
                                                     "--executor", "inline"]),
                                 capture_output=True, text=True, env=_env(), timeout=240)
            assert res.returncode == 2, res.stdout + res.stderr
            assert res.stdout == "", res.stdout       # no "run ..." line before the refusal
            error, hint = _said(res)
            assert error.startswith("cannot ") and "writable" in hint, (error, hint)
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    runs = json.loads(_cli("runs", "--store", ledger, "--json").stdout)
    assert [r["run_id"] for r in runs] == [run_id] and runs[0]["state"] == "failed"


# -- the progress bar: a frame is one reading of the counts -------------------------------

_FRAME = re.compile(r"(\d+)/(\d+|\?) running (\d+)  failed (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _on_a_terminal(argv: list[str], env: dict[str, str], timeout: float = 240) -> str:
    """What ``argv`` draws on a terminal (a pty), until it exits."""
    main, sub = pty.openpty()
    proc = subprocess.Popen(argv, stdin=sub, stdout=sub, stderr=sub, env=env, close_fds=True)
    os.close(sub)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                try:
                    data = os.read(main, 65536)
                except OSError:     # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")[-2000:]
    return _ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def test_the_progress_bar_draws_each_frame_from_one_reading(flow: Path,
                                                           tmp_path: Path) -> None:
    screen = _on_a_terminal([sys.executable, "-m", "ledgerflow", "run", f"{flow}:naps",
                             "-p", "n=8", "--workers", "4", "--executor", "threads",
                             "--store", str(tmp_path / "l.duckdb")],
                            _env(NAP="1.5", COLUMNS="120", LINES="40", TERM="xterm"))
    frames = [tuple(m.groups()) for m in _FRAME.finditer(screen)]
    assert frames, screen[-2000:]
    for done, total, running, failed in frames:
        if total == "?":
            continue
        # a frame never pairs this moment's running count with an older total
        assert int(done) + int(running) + int(failed) <= int(total), (frames, screen[-500:])
    assert any(int(f[2]) == 4 for f in frames), frames       # four at once, as asked
    assert frames[-1] == ("9", "9", "0", "0"), frames         # items + 8 naps, all done


# -- cancel says what it did, and refuses what nothing would act on -----------------------

def test_cancel_of_a_submitted_run_says_it_is_cancelled(flow: Path, tmp_path: Path) -> None:
    ledger = str(tmp_path / "l.duckdb")
    res = _cli("submit", f"{flow}:naps", "--store", ledger)
    run_id = res.stdout.split()[1]
    res = _cli("cancel", run_id, "--store", ledger)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"run {run_id} cancelled (no driver had taken it)"
    status = _cli("status", run_id, "--store", ledger)
    assert status.stdout.splitlines()[:2] == [f"run {run_id} (naps): cancelled", "tasks: none"]


def test_cancel_of_a_waiting_run_nobody_drives_ends_it(flow: Path, tmp_path: Path) -> None:
    ledger = str(tmp_path / "l.duckdb")
    first = _run_json(flow, "gated", ledger)
    assert first["state"] == "waiting"
    run_id = first["run_id"]
    res = _cli("cancel", run_id, "--store", ledger)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"run {run_id} cancelled (no process was driving it)"
    doc = json.loads(_cli("status", run_id, "--store", ledger, "--json").stdout)
    assert doc["state"] == "cancelled"
    assert {t["state"] for t in doc["tasks"] if t["key"] == "send"} == {"cancelled"}
    res = _cli("cancel", run_id, "--store", ledger)         # ended: nothing to cancel
    assert res.returncode == 2 and "already ended cancelled" in res.stderr


def test_cancel_of_a_waiting_run_whose_pipeline_is_gone_is_refused(flow: Path,
                                                                   tmp_path: Path) -> None:
    ledger = str(tmp_path / "l.duckdb")
    run_id = _run_json(flow, "gated", ledger)["run_id"]
    flow.unlink()                           # nothing can take the run over to cancel it
    res = _cli("cancel", run_id, "--store", ledger)
    assert res.returncode == 2 and res.stdout == ""
    error, hint = _said(res)
    assert f"run {run_id} has no driver and cannot be taken over to cancel it" in error
    assert hint
    doc = json.loads(_cli("status", run_id, "--store", ledger, "--json").stdout)
    assert doc["state"] == "waiting"        # the ledger is untouched


def test_cancel_of_a_run_whose_driver_died_ends_it(flow: Path, tmp_path: Path) -> None:
    ledger = str(tmp_path / "l.duckdb")
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", f"{flow}:naps",
                             "-p", "n=2", "--store", ledger, "--executor", "inline"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(NAP="120"))
    assert proc.stdout is not None
    run_id = proc.stdout.readline().split()[1]

    def napping() -> bool:
        doc = json.loads(_cli("status", run_id, "--store", ledger, "--json").stdout)
        return doc["counts"].get("running", 0) == 1

    wait_until(napping, timeout=120, what="nap[0] running", every=0.5)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    res = _cli("cancel", run_id, "--store", ledger)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"run {run_id} cancelled (no process was driving it)"
    doc = json.loads(_cli("status", run_id, "--store", ledger, "--json").stdout)
    assert doc["state"] == "cancelled"
    assert all(t["state"] in ("cancelled", "succeeded") for t in doc["tasks"]), doc["tasks"]
    import ledgerflow
    outcomes = [a["outcome"] for a in ledgerflow.get_run(run_id, store=ledger).attempts()]
    assert "lost" in outcomes, outcomes      # the killed attempt is recorded as lost


# -- a root cause is one line ----------------------------------------------------------------

def test_the_root_cause_is_one_line_in_a_pipe(flow: Path, tmp_path: Path) -> None:
    res = _cli("run", f"{flow}:broken", "--store", str(tmp_path / "l.duckdb"), "--executor",
               "inline")
    assert res.returncode == 1
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("root cause: "))
    assert line.rstrip().endswith("the lazy dog"), res.stdout   # whole, not cut at 100
    assert len(line) > 150


# -- an agent task whose function returns no prompt ---------------------------------------

AGENT = '''
from ledgerflow import pipeline
from ledgerflow_agents import MockModel, agent_task

@agent_task(model=MockModel(turns=[{"text": "x"}]), retries=2)
def ask(question: str) -> str:
    question.upper()                    # forgot to return it


@pipeline
def flow(q: str = "hi"):
    return ask(q)
'''


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_an_agent_function_returning_no_prompt_is_named_and_not_retried(
        tmp_path: Path, executor: str) -> None:
    pytest.importorskip("ledgerflow_agents")
    path = tmp_path / "agentflow.py"
    path.write_text(AGENT)
    ledger = str(tmp_path / "l.duckdb")
    res = _cli("run", str(path), "--store", ledger, "--executor", executor, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and doc["state"] == "failed"
    assert [t["attempts"] for t in doc["tasks"]] == [1]      # a definition error: no retry
    error = doc["root_cause"]["error"]
    assert error.startswith(f"NotAPrompt: ask() at {path}:5: ")
    assert "must return the prompt" in error and "returned: None" in error


# -- an import that fails on ledgerflow's own error keeps that error's fix ----------------

def test_an_import_failing_on_a_ledgerflow_error_shows_its_own_fix(tmp_path: Path) -> None:
    pytest.importorskip("ledgerflow_agents")
    path = tmp_path / "agentflow.py"
    path.write_text(AGENT.replace('model=MockModel(turns=[{"text": "x"}])', 'model="mock"'))
    res = _cli("run", str(path), "--store", str(tmp_path / "l.duckdb"))
    assert res.returncode == 2 and res.stdout == ""
    error, hint = _said(res)
    assert error == (f"importing {path} failed at line 5: ConfigError: the mock model needs "
                     "a script")
    assert hint.startswith("pass MockModel(turns=[...]) as model=, or set "), hint
    assert not (tmp_path / "l.duckdb").exists()
