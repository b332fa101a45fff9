"""Damaged ledgers are bad input: exit 2 with one Error line and a Hint, the file left as
it is, ``pipeline doctor`` says what is wrong, ``pipeline repair`` rebuilds what the
journals hold; a damaged journal of one run never takes the others down."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.subprocess

FLOW = '''
import os, time
from ledgerflow import pipeline, task

@task
def make(i: int) -> list[int]:
    return list(range(1000 * (i + 1)))           # over 2 KB: kept in a result file

@task
def effect(xs: list[int]) -> int:
    side = os.environ.get("SIDE")
    if side:
        with open(side, "a") as fh:
            fh.write("effect\\n")
    time.sleep(float(os.environ.get("DELAY", "0")))
    if os.environ.get("FAIL"):
        raise RuntimeError("asked to fail")
    return len(xs)

@pipeline
def p(n: int = 6):
    return effect.map(make.map(list(range(n))))
'''


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env["SIDE"] = str(tmp_path / "side.log")
    return flow, str(tmp_path / "ledger.duckdb"), env


def _run(flow: Path, ledger: str, env: dict[str, str], *params: str, **extra: str) -> str:
    res = _cli("run", str(flow), *(a for p in params for a in ("-p", p)), "--store", ledger,
               "--executor", "inline", "--json", env={**env, **extra})
    return json.loads(res.stdout)["run_id"]


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _refused(res: subprocess.CompletedProcess[str], needle: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2, res.stderr
    assert lines[0].startswith("Error: ") and needle in lines[0], lines[0]
    assert lines[1].startswith("Hint: ") and "pipeline repair" in lines[1], lines[1]


def _truncate(path: str) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2)


def _checksum(path: str) -> None:
    with open(path, "r+b") as fh:
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _no_tables(path: str) -> None:
    os.unlink(path)
    duckdb.connect(path).close()


@pytest.mark.parametrize(("damage", "needle"), [
    (_truncate, "is damaged"), (_checksum, "is damaged"), (_no_tables, "not in the ledger's tables"),
], ids=["truncated", "checksum", "no-tables"])
def test_a_damaged_file_is_refused_then_repaired(project, damage, needle) -> None:
    flow, ledger, env = project
    run_id = _run(flow, ledger, env, "n=40")
    damage(ledger)
    before = _digest(ledger)
    _refused(_cli("status", run_id, "--store", ledger, env=env), needle)
    if damage is not _no_tables:
        _refused(_cli("runs", "--store", ledger, env=env), needle)
        _refused(_cli("run", str(flow), "--store", ledger, env=env), needle)
    assert _digest(ledger) == before, "a refused command changed the ledger"
    doctor = _cli("doctor", "--store", ledger, env=env)
    assert doctor.returncode == 2 and "PROBLEM" in doctor.stdout
    assert "fix: pipeline repair" in doctor.stdout
    assert _digest(ledger) == before, "doctor changed the ledger"
    repaired = _cli("repair", "--store", ledger, env=env)
    assert repaired.returncode == 0, repaired.stderr
    assert list(Path(ledger).parent.glob("ledger.duckdb.broken-*"))      # the old one kept
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert status["state"] == "succeeded" and len(status["tasks"]) == 80
    assert _cli("doctor", "--store", ledger, env=env).returncode == 0


def test_an_unwritable_ledger_folder_is_bad_input(project, tmp_path: Path) -> None:
    flow, _, env = project
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the ledger's folder should be")
    res = _cli("run", str(flow), "--store", str(blocker / "ledger.duckdb"), env=env)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("Error: cannot ") and lines[1].startswith(
        "Hint: ")


def test_a_deleted_result_file_is_made_again_by_the_resume(project) -> None:
    flow, ledger, env = project
    run_id = _run(flow, ledger, env, FAIL="1")
    results = sorted((Path(ledger + ".d") / "results").rglob("*.json"))
    assert results
    results[0].unlink()
    doctor = _cli("doctor", "--store", ledger, env=env)
    assert doctor.returncode == 2 and "result file of make[" in doctor.stdout
    res = _cli("resume", run_id, "--store", ledger, "--executor", "inline", env=env)
    assert res.returncode == 0, res.stderr
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert status["state"] == "succeeded"
    assert _cli("doctor", "--store", ledger, env=env).returncode == 0


def _killed_mid_run(flow: Path, ledger: str, env: dict[str, str]) -> tuple[str, Path]:
    """A run killed while it ran (its journal is still live) and another that finished."""
    done = _run(flow, ledger, env, "n=2")
    Path(env["SIDE"]).unlink()
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", str(flow), "--store",
                             ledger, "--executor", "inline", "-p", "n=6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "DELAY": "0.3"})
    assert proc.stdout is not None
    run_id = proc.stdout.readline().split()[1]
    side = Path(env["SIDE"])
    wait_until(lambda: side.exists() and side.read_text().count("effect") >= 4,
               what="effects of the second run")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    (journal,) = (Path(ledger + ".d") / "journals").glob(f"{run_id}.*.jsonl")
    assert done
    return run_id, journal


def _garbage(journal: Path) -> None:
    with open(journal, "ab") as fh:
        fh.write(b"this is not a journal line\n")


def _wrong_shape(journal: Path) -> None:
    lines = journal.read_bytes().splitlines(keepends=True)
    lines.insert(3, b'[["E","not-a-number","x"]]\n')
    journal.write_bytes(b"".join(lines))


def _flipped(journal: Path) -> None:
    data = bytearray(journal.read_bytes())
    middle = len(data) // 2
    while data[middle] in b"\n\t":
        middle += 1
    data[middle] ^= 0x20
    journal.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_garbage, _wrong_shape, _flipped],
                         ids=["garbage-line", "wrong-shape", "flipped-byte"])
def test_a_damaged_journal_is_used_up_to_the_damage(project, damage) -> None:
    flow, ledger, env = project
    run_id, journal = _killed_mid_run(flow, ledger, env)
    damage(journal)
    status = _cli("status", run_id, "--store", ledger, env=env)
    assert status.returncode in (0, 1), status.stderr
    assert f"damaged: journal {journal.name} is damaged at byte" in status.stdout
    runs = _cli("runs", "--store", ledger, "--json", env=env)     # every run still listed
    assert runs.returncode == 0 and len(json.loads(runs.stdout)) == 2
    doctor = _cli("doctor", "--store", ledger, env=env)
    assert doctor.returncode == 2 and f"{journal.name} is damaged at byte" in doctor.stdout
    assert f"fix: pipeline resume {run_id} re-runs it" in doctor.stdout     # its real id
    assert "RUN_ID" not in doctor.stdout
    res = _cli("resume", run_id, "--store", ledger, "--executor", "inline", env=env)
    assert res.returncode == 0, res.stderr
    view = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert view["state"] == "succeeded" and len(view["tasks"]) == 12
    time.sleep(0)       # the damage stays reported, the run is complete
    assert "damaged" in _cli("status", run_id, "--store", ledger, env=env).stdout
    doctor = _cli("doctor", "--store", ledger, env=env)     # resumed past: history
    assert doctor.returncode == 0, doctor.stdout
    assert f"{journal.name}" in doctor.stdout and "history" in doctor.stdout    # (archived)


def _foreign_duckdb(path: str) -> None:
    con = duckdb.connect(path)
    con.execute("CREATE TABLE sales(id INTEGER)")
    con.close()


def _text(path: str) -> None:
    Path(path).write_text("not a database\n")


@pytest.mark.parametrize("make", [_foreign_duckdb, _text], ids=["foreign-duckdb", "text"])
def test_someone_elses_file_is_never_repaired_away(project, make) -> None:
    _, ledger, env = project
    make(ledger)
    before = _digest(ledger)
    doctor = _cli("doctor", "--store", ledger, env=env)
    assert doctor.returncode == 2 and "not a ledgerflow ledger" in doctor.stdout
    assert "fix: pass --store the path of a ledgerflow ledger" in doctor.stdout
    repaired = _cli("repair", "--store", ledger, env=env)
    assert repaired.returncode == 2 and "nothing to rebuild" in repaired.stderr
    assert _digest(ledger) == before
    assert not list(Path(ledger).parent.glob("ledger.duckdb.broken-*"))


# -- issue 34: what a kill leaves is completed, not refused ---------------------------------

def _cut_header(path: str) -> None:
    """What a kill while DuckDB wrote a new file's headers leaves: part of them."""
    fresh = path + ".fresh"
    duckdb.connect(fresh).close()
    Path(path).write_bytes(Path(fresh).read_bytes()[:4096])
    os.unlink(fresh)


@pytest.mark.parametrize("cut", [lambda p: Path(p).write_bytes(b""), _cut_header],
                         ids=["zero-byte", "part-of-the-header"])
def test_a_ledger_file_cut_at_its_creation_is_a_new_ledger_to_complete(project, cut) -> None:
    flow, ledger, env = project
    proc = subprocess.Popen([sys.executable, "-m", "ledgerflow", "run", str(flow), "--store",
                             ledger, "--executor", "inline", "-p", "n=3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "DELAY": "30", "LEDGERFLOW_FOLD_INTERVAL": "3600"})
    assert proc.stdout is not None
    run_id = proc.stdout.readline().split()[1]
    side = Path(env["SIDE"])
    wait_until(lambda: side.exists() and "effect" in side.read_text(), what="the first effect")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    cut(ledger)
    status = _cli("status", run_id, "--store", ledger, "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "running"
    runs = _cli("runs", "--store", ledger, "--json", env=env)
    assert runs.returncode == 0 and [r["run_id"] for r in json.loads(runs.stdout)] == [run_id]
    assert "damaged" not in _cli("doctor", "--store", ledger, env=env).stdout
    res = _cli("resume", run_id, "--store", ledger, "--executor", "inline", env=env)
    assert res.returncode == 0, res.stderr
    con = duckdb.connect(ledger, read_only=True)      # the tables hold the run now
    try:
        assert con.execute("SELECT state FROM runs WHERE run_id = ?",
                           [run_id]).fetchall() == [("succeeded",)]
    finally:
        con.close()


def test_a_schema_version_older_than_the_tables_is_damage_doctor_and_repair_handle(
        project) -> None:
    flow, ledger, env = project
    run_id = _run(flow, ledger, env, "n=2")
    con = duckdb.connect(ledger)
    con.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    con.close()
    _refused(_cli("runs", "--store", ledger, env=env), "older than its tables")
    doctor = _cli("doctor", "--store", ledger, env=env)
    assert doctor.returncode == 2 and "older than its tables" in doctor.stdout, doctor.stderr
    assert "fix: pipeline repair" in doctor.stdout
    repaired = _cli("repair", "--store", ledger, env=env)
    assert repaired.returncode == 0, repaired.stderr
    status = json.loads(_cli("status", run_id, "--store", ledger, "--json", env=env).stdout)
    assert status["state"] == "succeeded" and len(status["tasks"]) == 4
    assert _cli("doctor", "--store", ledger, env=env).returncode == 0


KILLED_IN_FINAL_FOLD = '''
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from flow import p
from ledgerflow_stores.duckdb.fold import FoldPolicy
from ledgerflow_stores.duckdb.store import DuckDBStore
# a driver whose run finished and that died before its final fold: the journal holds the
# run's end, the file does not
st = DuckDBStore(sys.argv[2], policy=FoldPolicy(fold_at_release=False, interval=3600))
run = p.run(n=2, store=st, executor="inline")
print(run.run_id, run.state, flush=True)
os._exit(0)
'''


def test_resume_after_a_kill_in_the_final_fold_folds_the_journal_first(
        project, tmp_path: Path) -> None:
    flow, ledger, env = project
    script = tmp_path / "killed.py"
    script.write_text(KILLED_IN_FINAL_FOLD)
    out = subprocess.run([sys.executable, str(script), str(flow), ledger], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run_id, state = out.stdout.split()
    assert state == "succeeded"
    assert list((Path(ledger + ".d") / "journals").glob(f"{run_id}.*.jsonl"))   # unfolded
    res = _cli("resume", run_id, "--store", ledger, "--executor", "inline", env=env)
    assert "succeeded" in res.stdout + res.stderr
    # the writing command folded the orphaned journal: the tables hold the finished run
    assert not list((Path(ledger + ".d") / "journals").glob(f"{run_id}.*.jsonl"))
    con = duckdb.connect(ledger, read_only=True)
    try:
        assert con.execute("SELECT state FROM runs WHERE run_id = ?",
                           [run_id]).fetchall() == [("succeeded",)]
    finally:
        con.close()
