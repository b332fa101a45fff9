"""The ledger under CPU load and after damage (issue 34), in bounded form for CI.

Readers get in while a long run writes under a CPU hog and a cancel arrives; a ledger
file cut to zero bytes at its creation is completed from the journals beside it; a
``repair`` after a damaged journal line keeps what the old tables held.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pytest

from tests.integration.killing import Project, Tally, journals
from tests.waiting import wait_until

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

HOG = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass\n"


class CpuHog:
    """Two busy-loop processes while it is on (each ends by itself after 300 s)."""

    def __init__(self) -> None:
        self.hogs: list[subprocess.Popen[bytes]] = []

    def on(self) -> None:
        self.hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]

    def off(self) -> None:
        for hog in self.hogs:
            hog.kill()
            hog.wait(timeout=30)
        self.hogs = []


@pytest.fixture
def cpu_hog() -> Iterator[CpuHog]:
    """Two busy loops, turned on by the test for the part that must run under load (the
    suite's other tests share the machine's two cores with them)."""
    hog = CpuHog()
    try:
        yield hog
    finally:
        hog.off()


def _project(tmp_path: Path, **env: str) -> Project:
    return Project(tmp_path, Tally(0), **env)


def _status_calls(p: Project, run_id: str, n: int = 50) -> tuple[list, list[str]]:
    """``n`` ``status`` calls, ten at a time (the 50 of issue 34), every tenth with
    ``--json`` (every task's row: about three times the work of the table),
    the others the table a user watches; stops early once three were refused."""
    answers: list[subprocess.CompletedProcess[str]] = []

    def status(i: int) -> subprocess.CompletedProcess[str] | None:
        if sum(a.returncode != 0 for a in answers) >= 3:
            return None                          # it failed already: do not wait 50 times
        res = p.cli("status", run_id, *(["--json"] if i % 10 == 0 else []), timeout=120)
        answers.append(res)
        return res
    with ThreadPoolExecutor(10) as pool:
        list(pool.map(status, range(n)))
    refused = [a.stderr.strip() for a in answers if a.returncode != 0]
    return answers, refused


def _state(out: str) -> str:
    """The run state a ``status`` printed: its JSON's, or the table's first line's
    (``run ID (pipeline): state``)."""
    if out.startswith("{"):
        return str(json.loads(out)["state"])
    found = re.match(r"run \S+ \(.*?\): (\w+)", out)
    return found.group(1) if found else out[:200]


@pytest.mark.timeout(600)
def test_readers_and_a_cancel_get_in_while_a_long_run_writes_under_load(
        tmp_path: Path, cpu_hog: CpuHog) -> None:
    p = _project(tmp_path, DELAY="0.001")
    driver = p.start("run", f"{p.flow}:fan", "-p", "n=100000", "--executor", "inline")
    try:
        wait_until(lambda: sum(p.effects().values()) >= 50, timeout=120,
                   what="the long run to be under way")
        run_id = p.output(driver).split()[1]
        cpu_hog.on()        # the readers and the cancel under load (the driver too)
        answers, refused = _status_calls(p, run_id)
        still_running = driver.poll() is None
        cancel = p.cli("cancel", run_id, timeout=120)
        cpu_hog.off()
        try:
            code: int | None = driver.wait(timeout=120)      # the cancel arrives: it stops
        except subprocess.TimeoutExpired:
            code = None
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
    assert not refused, f"{len(refused)} of {len(answers)} status calls failed: {refused[:1]}"
    assert sorted(_state(a.stdout) for a in answers) == ["running"] * len(answers)
    assert still_running, "the run ended before the cancel: make it longer"
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert code is not None, "the driver did not stop within 120 s of the cancel"
    assert code in (0, 1), p.output(driver)
    view = json.loads(p.cli("status", run_id, "--json").stdout)
    assert view["state"] == "cancelled"
    assert view["counts"].get("succeeded", 0) < 100001


def test_a_zero_byte_ledger_beside_journals_is_completed_not_damaged(tmp_path: Path) -> None:
    p = _project(tmp_path, DELAY="0.05", LEDGERFLOW_FOLD_INTERVAL="3600")
    for flow, mark in ((f"{p.flow}:fan", "effect["), (f"{p.flow}:progs", "prog[")):
        proc = p.start("run", flow, "-p", "n=8", "--executor", "inline")   # journals only
        wait_until(lambda mark=mark: sum(n for k, n in p.effects().items()
                                         if k.startswith(mark)) >= 2,
                   timeout=120, what=f"two {mark}] effects")
        p.kill(proc)
    Path(p.ledger).write_bytes(b"")            # what a kill as the file was made leaves
    ids = [j.name.split(".")[0] for j in journals(p.ledger)]
    assert len(ids) == 2
    runs = p.cli("runs", "--json")
    assert runs.returncode == 0, runs.stderr
    assert sorted(r["run_id"] for r in json.loads(runs.stdout)) == sorted(ids)
    doctor = p.cli("doctor")
    assert "damaged" not in doctor.stdout + doctor.stderr, doctor.stdout
    for run_id in ids:
        before = p.status(run_id)
        assert before is not None and before["state"] == "running"
        res = p.cli("resume", run_id, "--executor", "inline")
        assert res.returncode == 0, res.stdout + res.stderr
        after = p.finish(run_id)                # (already done: folds, checks the tables)
        assert after is not None and after["state"] == "succeeded"
    assert not (p.tally.lost or p.tally.bricked or p.tally.stale), p.tally.failures()


def _damage_gz_line(path: Path) -> None:
    """Replace a line in the middle of an archived journal with garbage."""
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    lines[len(lines) // 2] = b"this is not a journal line\n"
    path.write_bytes(gzip.compress(b"".join(lines)))


def _tables(ledger: str, run_id: str) -> tuple[str, dict[str, str]]:
    con = duckdb.connect(ledger, read_only=True)
    try:
        (state,) = con.execute("SELECT state FROM runs WHERE run_id = ?", [run_id]).fetchone()
        tasks = dict(con.execute("SELECT task_key, state FROM tasks WHERE run_id = ?",
                                 [run_id]).fetchall())
    finally:
        con.close()
    return state, tasks


def test_repair_after_a_damaged_journal_line_keeps_what_the_tables_held(
        tmp_path: Path) -> None:
    p = _project(tmp_path, DELAY="0.05", LEDGERFLOW_FOLD_INTERVAL="0.1",
                 LEDGERFLOW_FOLD_WAKE_BYTES="1")
    done = p.cli("run", f"{p.flow}:fan", "-p", "n=30", "--executor", "inline", "--json")
    assert done.returncode == 0, done.stderr
    done_id = json.loads(done.stdout)["run_id"]
    result = p.cli("result", done_id, "--json").stdout
    held_done = _tables(p.ledger, done_id)
    assert held_done[0] == "succeeded" and len(held_done[1]) == 32
    Path(p.env["SIDE"]).unlink()
    proc = p.start("run", f"{p.flow}:fan", "-p", "n=40", "-p", "start=100",   # not cached
                   "--executor", "inline")
    wait_until(lambda: sum(p.effects().values()) >= 20, timeout=120, what="20 effects")
    p.kill(proc)
    (live,) = journals(p.ledger)
    dead_id = live.name.split(".")[0]
    p.cli("fold")                               # the tables now hold the dead run's successes
    held_dead = {k for k, s in _tables(p.ledger, dead_id)[1].items() if s == "succeeded"}
    assert len(held_dead) >= 20
    (archived,) = Path(p.ledger + ".d", "journals").glob(f"{done_id}.*.jsonl.gz")
    _damage_gz_line(archived)
    lines = live.read_bytes().splitlines(keepends=True)
    lines[len(lines) // 3] = b"this is not a journal line\n"
    live.write_bytes(b"".join(lines))
    repaired = p.cli("repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    # the finished run stays finished, with every task and its result
    assert _tables(p.ledger, done_id) == held_done
    view = p.status(done_id)
    assert view is not None and view["state"] == "succeeded" and len(view["tasks"]) == 32
    assert p.cli("result", done_id, "--json").stdout == result
    # the dead run keeps every success the old tables held; its resume never repeats one
    kept = {k for k, s in _tables(p.ledger, dead_id)[1].items() if s == "succeeded"}
    assert held_dead <= kept, sorted(held_dead - kept)[:5]
    ran = p.effects()
    res = p.cli("resume", dead_id, "--executor", "inline")
    assert res.returncode == 0, res.stdout + res.stderr
    again = p.effects() - ran
    assert not {k for k in again if k in held_dead}, "a success the tables held ran again"
    after = p.status(dead_id)
    assert after is not None and after["state"] == "succeeded"
    p.check_sql(dead_id, after)
    assert not (p.tally.bricked or p.tally.stale), p.tally.failures()
