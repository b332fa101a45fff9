"""What a shared PostgreSQL ledger must survive, in real processes on a real server.

* the database stopped (``pg_ctl stop -m immediate``) in the middle of a
  doc-index run and started again: nothing committed is lost, nothing is
  applied twice, the index has no duplicate rows;
* a driver frozen (SIGSTOP) past its lease while a second driver takes the
  run over: when it wakes (SIGCONT) it finds its token stale and exits
  without writing a row or doing more work;
* two ``pipeline worker`` processes sharing ten submitted runs: each run is
  driven once; a worker killed (SIGKILL) mid-run has its run finished by
  the other.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.waiting import wait_until

from .pgserver import PgServer

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RECIPE_DIR = ROOT / "recipes" / "doc_index"
RECIPE_TESTS = ROOT / "tests" / "recipes"
CLI = [sys.executable, "-m", "ledgerflow"]


def q(url: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as con:
        return con.execute(sql, params).fetchall()


def status(url: str, run_id: str) -> Any:
    """The run as any reader sees it (tables plus commits not folded yet)."""
    from ledgerflow_postgres import PostgresStore
    st = PostgresStore(url, wait=30)
    try:
        return st.get_run(run_id)
    finally:
        st.close()


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    env.update(PYTHONUNBUFFERED="1", LEDGERFLOW_BLOB_DIR=str(tmp_path / "blobs"),
               PYTHONPATH=os.pathsep.join([str(RECIPE_DIR), str(RECIPE_TESTS), *sys.path]))
    env.update(extra)
    return env


def drain(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"process did not end in {timeout}s:\n{out}\n{err}") from None
    return out, err


# -- the database stops mid-run -----------------------------------------------------------

WRAPPER = textwrap.dedent("""
    # The doc-index recipe with a slowed-down hashing embedder (tests/recipes).
    import doc_index_testutil
    from ledgerflow.control import load_module

    doc_index_testutil.register_slow_hashing()
    doc_index = load_module(doc_index_testutil.PIPELINE_FILE).doc_index
""")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A small corpus copied from the recipe's: the package licences and notices."""
    dest = tmp_path / "corpus"
    shutil.copytree(RECIPE_DIR / "corpus" / "packages", dest / "packages")
    return dest


@pytest.mark.parametrize("wait", ["60", "1"], ids=["driver-waits", "unavailable-then-resume"])
def test_database_stopped_mid_run_loses_nothing_and_applies_nothing_twice(
        pg_server: PgServer, pg_url: str, corpus: Path, tmp_path: Path, wait: str) -> None:
    """The seed's experiment: with a wait longer than the outage the driver goes on by
    itself; with a shorter one it stops with "store unavailable" and `pipeline resume`
    finishes the run. Either way the result is the same."""
    wrapper = tmp_path / "slow_doc_index.py"
    wrapper.write_text(WRAPPER)
    index, marker = tmp_path / "index.duckdb", tmp_path / "embed-calls.txt"
    n_docs = len([p for p in corpus.rglob("*") if p.is_file()])
    env = env_for(tmp_path, DOC_INDEX_TEST_MARKER=str(marker), DOC_INDEX_TEST_DELAY="0.25",
                  LEDGERFLOW_STORE_WAIT=wait, LEDGERFLOW_LEASE_TTL="30")
    proc = subprocess.Popen(
        [*CLI, "run", str(wrapper), "-p", f"source={corpus}", "-p", f"index={index}",
         "-p", "embedder=slow-hashing", "--store", pg_url, "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().split()[1]
        wait_until(lambda: (marker.exists() and len(marker.read_text().split()) >= 3)
                   or proc.poll() is not None, timeout=120, what="three embed calls")
        assert proc.poll() is None, "the run ended before the database could be stopped"
        # what the ledger holds as committed right now: it must all survive
        committed = {k: t.result_hash for k, t in status(pg_url, run_id).tasks.items()
                     if t.state == "succeeded"}
        assert any(k.startswith("embed[") for k in committed)
        pg_server.stop("immediate")          # a crash of the server, mid-transaction maybe
        time.sleep(3)
        pg_server.start()                    # crash recovery, then the driver goes on
        out, err = drain(proc, 180)
    finally:
        if proc.poll() is None:
            proc.kill()
        pg_server.start() if not _up(pg_server) else None
    assert "unreachable while" in err, err
    if wait == "1":     # waited past the bound: `pipeline resume` finishes the run
        assert proc.returncode == 1 and "Error: store unavailable: database" in err, err
        assert f"pipeline resume {run_id}" in err
        done = subprocess.run([*CLI, "resume", run_id, "--store", pg_url], env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        assert proc.returncode == 0 and "is back after" in err, out + err
        # it went on by itself: each document was embedded exactly once
        assert len(marker.read_text().split()) == n_docs

    rows = dict(q(pg_url, "SELECT task_key, result_hash FROM tasks WHERE run_id = %s "
                          "AND state = 'succeeded'", [run_id]))
    assert q(pg_url, "SELECT state FROM runs WHERE run_id = %s", [run_id]) == [("succeeded",)]
    # 0 committed results lost: every success committed before the stop is kept as it was
    assert {k: rows.get(k) for k in committed} == committed
    # nothing applied twice: one row per transition, attempt, result and commit
    for sql in ("SELECT seq FROM events WHERE run_id = %s",
                "SELECT task_key || '/' || attempt FROM attempts WHERE run_id = %s",
                "SELECT task_key || '/' || attempt FROM results WHERE run_id = %s",
                "SELECT token || '/' || seq FROM commits WHERE run_id = %s"):
        values = [r[0] for r in q(pg_url, sql, [run_id])]
        assert values and len(values) == len(set(values)), sql
    ok = Counter(k for k, a in q(pg_url, "SELECT task_key, outcome FROM attempts WHERE "
                                         "run_id = %s", [run_id]) if a == "ok")
    assert set(ok.values()) == {1}
    # the index: no duplicate rows, every document written once, same as without a stop
    import duckdb
    con = duckdb.connect(str(index), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM (SELECT doc_id, position FROM chunks "
                           "GROUP BY ALL HAVING count(*) > 1)").fetchall() == [(0,)]
        assert con.execute("SELECT count(DISTINCT doc_id), count(*) FROM writes"
                           ).fetchall() == [(n_docs, n_docs)]
        got = con.execute("SELECT doc_id, position, content_hash FROM chunks "
                          "ORDER BY ALL").fetchall()
    finally:
        con.close()
    sys.path[:0] = [str(RECIPE_DIR), str(RECIPE_TESTS)]
    import doc_index_testutil as util

    import ledgerflow_embed
    from ledgerflow.plugins import get_plugin_manager
    plugin = util.register_slow_hashing()
    try:
        ref = tmp_path / "reference.duckdb"
        util.build_locally(corpus, ref, embedder="slow-hashing")
        assert got == util.rows(ref)
    finally:        # leave this process's plugins as they were
        del sys.path[:2]
        if get_plugin_manager().is_registered(plugin):
            get_plugin_manager().unregister(plugin)
        ledgerflow_embed.clear_cache()


def _up(server: PgServer) -> bool:
    try:
        psycopg.connect(server.url, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


# -- a frozen driver wakes up after a takeover ------------------------------------------

FLOW = textwrap.dedent("""
    import os, time
    from ledgerflow import context, pipeline, task
    from ledgerflow.context import TaskCancelled

    LOG = os.environ.get("SIDE_EFFECTS", os.devnull)

    def effect(what, key):
        with open(LOG, "a") as fh:
            fh.write(f"{what} {key} {os.getpid()} {context().run_id}\\n")

    @task
    def work(i: int, tag: str = "", gate: str = "", gate_from: int = 0) -> int:
        ctx = context()
        effect("start", ctx.task_key)
        while gate and i >= gate_from and not os.path.exists(gate):   # held until it exists
            if ctx.cancel_requested:
                raise TaskCancelled()
            time.sleep(0.02)
        hang = os.environ.get("HANG_FROM") and i >= int(os.environ["HANG_FROM"])
        t = time.monotonic()
        while time.monotonic() - t < (60 if hang else float(os.environ.get("STEP", "0.1"))):
            if ctx.cancel_requested:
                raise TaskCancelled()
            time.sleep(0.02)
        effect("done", ctx.task_key)
        return i

    @pipeline
    def flow(n: int = 8, tag: str = "", gate: str = "", gate_from: int = 0):
        # a tag per run: nothing cached
        return work.map(list(range(n)), tag=tag, gate=gate, gate_from=gate_from)
""")


def effects(path: Path, run_id: str | None = None) -> list[tuple[str, str, int]]:
    """(what, task key, pid) of each side effect (of one run's tasks, if given)."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]      # a line being written is not counted
    return [(w, k, int(p)) for w, k, p, r in (ln.split() for ln in lines)
            if run_id is None or r == run_id]


def test_a_frozen_driver_finds_its_token_stale_and_exits_without_writing(
        pg_url: str, tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    side = tmp_path / "effects.txt"
    # tasks 0 and 1 finish at once; 2 and 3 (and the rest, in this driver) run until stopped
    env_a = env_for(tmp_path, SIDE_EFFECTS=str(side), HANG_FROM="2", LEDGERFLOW_LEASE_TTL="2")
    a = subprocess.Popen([*CLI, "run", str(flow), "-p", "n=8", "--store", pg_url,
                          "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env_a)
    try:
        assert a.stdout is not None
        run_id = a.stdout.readline().split()[1]
        # frozen once 0 and 1 are committed and 2 and 3 run (hanging)
        wait_until(lambda: len([e for e in effects(side) if e[0] == "start"]) >= 4
                   and status(pg_url, run_id).counts().get("succeeded") == 2, timeout=60,
                   what=lambda: f"two tasks done and two running: {effects(side)}")
        a.send_signal(signal.SIGSTOP)
        frozen_at = effects(side)
        assert sorted(e[1] for e in frozen_at if e[0] == "done") == ["work[0]", "work[1]"]
        # while A's lease is live, a takeover is refused
        early = subprocess.run([*CLI, "resume", run_id, "--store", pg_url],
                               env=env_for(tmp_path, SIDE_EFFECTS=str(side)),
                               capture_output=True, text=True, timeout=60)
        assert early.returncode == 2 and "still being driven" in early.stderr, early.stderr
        # past A's lease (2 s on the server's clock), B takes the run over and finishes it
        wait_until(lambda: q(pg_url, "SELECT expires_at < now() FROM leases "
                                     "WHERE run_id = %s", [run_id]) == [(True,)], timeout=30,
                   what="the frozen driver's lease to expire")
        tokened = ("SELECT (SELECT count(*) FROM events WHERE run_id = %(r)s AND token = 1),"
                   " (SELECT count(*) FROM attempts WHERE run_id = %(r)s AND token = 1),"
                   " (SELECT count(*) FROM commits WHERE run_id = %(r)s AND token = 1),"
                   " (SELECT count(*) FROM results WHERE run_id = %(r)s)")
        b = subprocess.run([*CLI, "resume", run_id, "--store", pg_url],
                           env=env_for(tmp_path, SIDE_EFFECTS=str(side)),
                           capture_output=True, text=True, timeout=120)
        assert b.returncode == 0, b.stdout + b.stderr
        before = q(pg_url, tokened, {"r": run_id})
        after_b = effects(side)
        # A wakes up: its token is stale, it stops at once, writing nothing
        a.send_signal(signal.SIGCONT)
        out, err = drain(a, 60)
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
            a.kill()
    assert a.returncode == 1, out + err
    assert "Error: lease lost:" in err, err
    assert q(pg_url, tokened, {"r": run_id}) == before
    assert effects(side) == after_b, "the stale driver did more work after it woke"
    view = q(pg_url, "SELECT state, token FROM runs WHERE run_id = %s", [run_id])
    assert view == [("succeeded", 2)]
    # what A finished before it froze was kept; B ran each of the others once
    pid_a = a.pid
    done = Counter(k for w, k, p in effects(side) if w == "done")
    assert done == Counter(f"work[{i}]" for i in range(8))
    assert {k for w, k, p in effects(side) if w == "done" and p == pid_a} == {"work[0]",
                                                                               "work[1]"}
    assert [a_ for (a_,) in q(pg_url, "SELECT outcome FROM attempts WHERE run_id = %s AND "
                                      "task_key = 'work[2]' ORDER BY id", [run_id])] == [
        "lost", "ok"]


# -- two workers share the submitted runs ---------------------------------------------

def _worker(url: str, tmp_path: Path, name: str, side: Path) -> subprocess.Popen[str]:
    with open(tmp_path / f"{name}.log", "w") as log:     # the child keeps its own copy
        # no --exit-idle: on a loaded machine the idle worker would be gone before the
        # kill it must take over from (the test stops it with SIGTERM at its end)
        return subprocess.Popen([*CLI, "worker", "--store", url, "--poll", "0.2",
                                 "--workers", "2"],
                                stdout=log, stderr=subprocess.STDOUT, text=True,
                                env=env_for(tmp_path, SIDE_EFFECTS=str(side), STEP="0.15",
                                            LEDGERFLOW_LEASE_TTL="2"))


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_two_workers_drive_each_submitted_run_once_and_take_over_a_killed_one(
        pg_url: str, tmp_path: Path, workers: list[subprocess.Popen[str]]) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    side = tmp_path / "effects.txt"
    env = env_for(tmp_path)
    # every task of the ten runs is held until the gate exists: the first worker to start
    # claims a run and holds it, so the other claims the next (a worker drives one at a time)
    gate = tmp_path / "gate"
    sub = subprocess.run([*CLI, "submit", str(flow), "-p", "n=3", "-p", "tag=0", "-p",
                          f"gate={gate}", "--store", pg_url, "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    ids = [json.loads(sub.stdout)["run_id"]]
    script = ("import sys; from ledgerflow.control import submit\n"
              "for i in range(1, 10):\n"
              "    print(submit(sys.argv[1], params={'n': 3, 'tag': str(i), 'gate': sys.argv[3]},"
              " store=sys.argv[2]))")
    more = subprocess.run([sys.executable, "-c", script, str(flow), pg_url, str(gate)],
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    ids += more.stdout.split()
    assert len(set(ids)) == 10
    assert q(pg_url, "SELECT DISTINCT state FROM runs") == [("submitted",)]
    workers += [_worker(pg_url, tmp_path, "w1", side), _worker(pg_url, tmp_path, "w2", side)]
    logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
    wait_until(lambda: all("claimed (token 2)" in log.read_text() for log in logs),
               timeout=120, what=lambda: f"both workers to claim a run: "
                                         f"{[log.read_text() for log in logs]}")
    gate.touch()
    wait_until(lambda: q(pg_url, "SELECT count(*) FROM runs WHERE state = 'succeeded'")
               == [(10,)], timeout=120,
               what=lambda: f"ten runs to succeed: {q(pg_url, 'SELECT run_id, state FROM runs')}")
    # each run driven once: one takeover (token 2) by one worker, each task executed once
    drivers = q(pg_url, "SELECT run_id, token, driver_pid FROM runs ORDER BY run_id")
    assert {t for _, t, _ in drivers} == {2}
    assert {p for _, _, p in drivers} == {w.pid for w in workers}, drivers
    for run_id, _, pid in drivers:
        ran = effects(side, run_id)
        assert sorted(k for w, k, _ in ran if w == "done") == ["work[0]", "work[1]", "work[2]"]
        assert {p for _, _, p in ran} == {pid}
    assert q(pg_url, "SELECT count(*), count(DISTINCT (run_id, task_key)) FROM attempts") == [
        (30, 30)]

    # a long run: work[0] finishes, the rest are held; the worker driving it is killed;
    # the gate opens and the other worker takes the run over
    hold = tmp_path / "hold"
    long_id = subprocess.run([sys.executable, "-c", "import sys; from ledgerflow.control "
                              "import submit; print(submit(sys.argv[1], params={'n': 8, "
                              "'tag': 'long', 'gate': sys.argv[3], 'gate_from': 1}, "
                              "store=sys.argv[2]))", str(flow), pg_url, str(hold)],
                             env=env, capture_output=True, text=True, timeout=60, check=True
                             ).stdout.strip()
    wait_until(lambda: any(w == "done" for w, _, _ in effects(side, long_id)), timeout=120,
               what="the long run's first task to finish")
    victim_pid = status(pg_url, long_id).driver_pid
    victim = next(w for w in workers if w.pid == victim_pid)
    survivor = next(w for w in workers if w.pid != victim_pid)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    hold.touch()
    wait_until(lambda: q(pg_url, "SELECT state FROM runs WHERE run_id = %s",
                         [long_id]) == [("succeeded",)], timeout=120,
               what="the survivor to finish the long run")
    assert q(pg_url, "SELECT token, driver_pid FROM runs WHERE run_id = %s", [long_id]) == [
        (3, survivor.pid)]
    ran = effects(side, long_id)
    assert {k for w, k, _ in ran if w == "done"} == {f"work[{i}]" for i in range(8)}
    assert {k for w, k, p in ran if w == "done" and p == victim_pid} == {"work[0]"}
    assert {p for w, _, p in ran} == {victim_pid, survivor.pid}
    out = (tmp_path / ("w1.log" if survivor is workers[0] else "w2.log")).read_text()
    assert f"run {long_id} claimed (token 3): its driver (pid {victim_pid} on this host) " \
        "is gone" in out, out
    # a submitted run's claim names no dead driver
    assert all(line.endswith("(token 2)") for log in logs for line in log.read_text()
               .splitlines() if "claimed (token 2)" in line), [log.read_text() for log in logs]
    survivor.send_signal(signal.SIGTERM)     # stop claiming; nothing is being driven
    survivor.wait(60)
    assert survivor.returncode == 0
