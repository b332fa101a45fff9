"""A writer killed inside DuckDB's checkpoint: the block it rewrote in place is torn.

DuckDB rewrites the file's metadata block (block 0) in place at every
checkpoint, and a SIGKILL inside that write cuts it. The next command finds the
marker the killed writer left, rebuilds the tables from the journals (nothing
committed is lost) and says so; the same damage with no killed writer is bad
input, refused with the fix and the file left as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.subprocess

# how long a stubbed open may wait for the file's lock (never reached: the stubs answer at once)
LOCK_WAIT = 5.0

FLOW = '''
from ledgerflow import pipeline, task

@task
def double(i: int) -> int:
    return 2 * i

@pipeline
def p(n: int = 5):
    return double.map(list(range(n)))
'''

HOLD = '''
import signal, sys
from ledgerflow_stores.duckdb.store import DuckDBStore
store = DuckDBStore(sys.argv[1])
with store.ledger.connect(True):
    print("writing", flush=True)
    signal.pause()          # holds the write connection until the test kills it
'''

BLOCK0 = 3 * 4096          # after DuckDB's three headers
PAGE = 4096                # a tear falls between pages: the first holds the block's checksum


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=180)


@pytest.fixture
def torn(tmp_path: Path) -> tuple[str, list[str], dict[str, str], bytes]:
    """A ledger of two runs whose second run's checkpoint tore block 0: the first run's
    file, with the first half of block 0 as the second run's checkpoint wrote it."""
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    ledger = str(tmp_path / "ledger.duckdb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    runs = []
    before = b""
    for n in (5, 7):
        before = Path(ledger).read_bytes() if runs else b""
        res = _cli("run", f"{flow}:p", "-p", f"n={n}", "--store", ledger, "--executor",
                   "inline", "--json", env=env)
        assert res.returncode == 0, res.stderr
        runs.append(json.loads(res.stdout)["run_id"])
    after = Path(ledger).read_bytes()
    # the write was cut after its first page: the new checksum, the old rest of the block
    assert before[BLOCK0 + PAGE:BLOCK0 + 64 * PAGE] != after[BLOCK0 + PAGE:BLOCK0 + 64 * PAGE]
    Path(ledger).write_bytes(before[:BLOCK0] + after[BLOCK0:BLOCK0 + PAGE]
                             + before[BLOCK0 + PAGE:])
    with pytest.raises(duckdb.Error, match="checksum"):
        duckdb.connect(ledger, read_only=True).close()
    return ledger, runs, env, after


def _killed_writer(ledger: str, env: dict[str, str]) -> int:
    """A real process that opened the ledger for writing, SIGKILLed while it had it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, ledger], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return proc.pid


def test_a_checkpoint_torn_by_a_kill_is_rebuilt_from_the_journals(torn) -> None:
    ledger, runs, env, whole = torn
    saved = Path(ledger).read_bytes()
    Path(ledger).write_bytes(whole)
    pid = _killed_writer(ledger, env)      # killed in its checkpoint: the file as it tore
    Path(ledger).write_bytes(saved)
    assert (Path(ledger + ".d") / "writers" / str(pid)).exists()
    res = _cli("status", runs[1], "--store", ledger, "--json", env=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["state"] == "succeeded"
    assert len(doc["tasks"]) == 7
    assert f"(pid {pid}); rebuilt from the journals" in res.stderr
    kept = [p for p in Path(ledger).parent.iterdir() if ".broken-" in p.name]
    assert len(kept) == 1 and kept[0].read_bytes() == saved    # the damaged file, kept
    assert not [p for p in Path(ledger).parent.iterdir() if ".repair-" in p.name]
    listed = _cli("runs", "--store", ledger, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert {r["run_id"] for r in json.loads(listed.stdout)} == set(runs)
    assert not (Path(ledger + ".d") / "writers" / str(pid)).exists()
    again = _cli("result", runs[1], "--store", ledger, "--json", env=env)
    assert again.returncode == 0 and "rebuilt" not in again.stderr, again.stderr
    assert json.loads(again.stdout) == [2 * i for i in range(7)]


def test_the_same_damage_with_no_killed_writer_is_refused_as_it_is(torn) -> None:
    ledger, runs, env, _ = torn
    digest = hashlib.sha256(Path(ledger).read_bytes()).hexdigest()
    res = _cli("status", runs[1], "--store", ledger, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ") and "is damaged" in lines[0], res.stderr
    assert lines[1].startswith("Hint: ") and "pipeline repair" in lines[1], res.stderr
    assert hashlib.sha256(Path(ledger).read_bytes()).hexdigest() == digest
    assert not [p for p in Path(ledger).parent.iterdir() if ".broken-" in p.name]


def test_a_write_leaves_no_marker_and_clears_a_killed_writers_when_the_file_is_whole(
        tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    ledger = str(tmp_path / "ledger.duckdb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    res = _cli("run", f"{flow}:p", "--store", ledger, "--executor", "inline", env=env)
    assert res.returncode == 0, res.stderr
    writers = Path(ledger + ".d") / "writers"
    assert list(writers.iterdir()) == []
    pid = _killed_writer(ledger, env)        # killed, but the file is whole
    assert [p.name for p in writers.iterdir()] == [str(pid)]
    res = _cli("run", f"{flow}:p", "-p", "n=3", "--store", ledger, "--executor", "inline",
               env=env)
    assert res.returncode == 0, res.stderr
    assert list(writers.iterdir()) == [] and "rebuilt" not in res.stderr


def test_two_commands_that_find_it_torn_at_once_rebuild_it_once(torn) -> None:
    ledger, runs, env, whole = torn
    saved = Path(ledger).read_bytes()
    Path(ledger).write_bytes(whole)
    _killed_writer(ledger, env)
    Path(ledger).write_bytes(saved)
    procs = [subprocess.Popen([sys.executable, "-m", "ledgerflow", "status", rid, "--store",
                               ledger, "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for rid in runs]
    outs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err
        assert json.loads(out)["state"] == "succeeded"
    assert sum("rebuilt from the journals" in err for _, err in outs) == 1
    kept = [p for p in Path(ledger).parent.iterdir() if ".broken-" in p.name]
    assert len(kept) == 1 and kept[0].read_bytes() == saved


def test_a_command_that_found_it_torn_after_another_rebuilt_it_opens_the_new_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other process rebuilt the file and forgot the killed writer's marker between
    this one's failed open and its look for markers: this one opens the rebuilt file,
    it does not call it damage."""
    from ledgerflow.errors import DamagedLedgerError
    from ledgerflow_stores.duckdb.connection import Ledger

    ledger = Ledger(str(tmp_path / "l.duckdb"), LOCK_WAIT, heal=lambda pids: None)
    assert ledger.writers is not None
    ledger.writers.folder.mkdir(parents=True)
    (ledger.writers.folder / "heal.lock").touch()     # the other process's heal took it
    opens: list[bool] = []

    def open_waiting(write: bool, _lock_wait: float) -> str:
        opens.append(write)
        if len(opens) == 1:         # torn when this process looked, rebuilt since
            raise DamagedLedgerError("ledger is damaged: Corrupt database file")
        return "the rebuilt file"
    monkeypatch.setattr(ledger, "_open_waiting", open_waiting)
    assert ledger._open_healing(False, LOCK_WAIT) == "the rebuilt file"
    assert opens == [False, False]


def test_damage_with_no_killed_writer_and_no_heal_ever_is_refused_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerflow.errors import DamagedLedgerError
    from ledgerflow_stores.duckdb.connection import Ledger

    ledger = Ledger(str(tmp_path / "l.duckdb"), LOCK_WAIT, heal=lambda pids: None)

    def open_waiting(write: bool, _lock_wait: float) -> str:
        raise DamagedLedgerError("ledger is damaged: Corrupt database file")
    monkeypatch.setattr(ledger, "_open_waiting", open_waiting)
    with pytest.raises(DamagedLedgerError):
        ledger._open_healing(False, LOCK_WAIT)
    assert not (tmp_path / "l.duckdb.d").exists()      # no heal lock made for bad input
