"""Ledger behaviour users rely on: caching rules, columnar results, lineage SQL, fencing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import ledgerflow
from ledgerflow import pipeline, task
from ledgerflow.errors import LeaseLostError
from ledgerflow.records import RunDefined, RunStateChanged, encode_line
from ledgerflow_stores.duckdb import DuckDBStore
from ledgerflow_stores.duckdb.lease import Heartbeat


def _executed(run: ledgerflow.Run) -> set[str]:
    return {t["key"] for t in run.tasks() if not t["cached"]}


def test_code_change_reruns_the_task_and_only_dependents_of_changed_output(ledger: str) -> None:
    @task
    def src() -> int:
        return 1

    @task(version="1")
    def middle(x: int) -> int:
        return x * 10

    @task
    def leaf(y: int) -> int:
        return y + 1

    @task
    def side(x: int) -> int:
        return x - 1

    def make():
        @pipeline
        def p():
            s = src()
            side(s)
            return leaf(middle(s))
        return p

    first = make().run(store=ledger, executor="inline")
    assert _executed(first) == {"src", "middle", "leaf", "side"}
    middle._version = "2"          # a new version, same output: leaf is reused
    second = make().run(store=ledger, executor="inline")
    assert _executed(second) == {"middle"}

    @task(version="3", name="middle")
    def middle_changed(x: int) -> int:
        return x * 100

    @pipeline
    def p3():
        s = src()
        side(s)
        return leaf(middle_changed(s))

    third = p3.run(store=ledger, executor="inline")
    assert _executed(third) == {"middle", "leaf"}
    assert third.result() == 101


def test_arrow_and_pandas_results_are_columnar_and_queryable(ledger: str) -> None:
    pd = pytest.importorskip("pandas")

    @task
    def table() -> pa.Table:
        return pa.table({"doc": ["a", "b"], "n": [1, 2]})

    @task
    def frame(t: pa.Table) -> object:
        return pd.DataFrame({"doc": t.column("doc").to_pylist(), "twice": [2, 4]})

    @pipeline
    def p():
        return frame(table())

    run = p.run(store=ledger, executor="threads").settle()     # (SQL on its file below)
    assert list(run.result()["twice"]) == [2, 4]          # the value itself, in process
    out = ledgerflow.get_run(run.run_id, store=ledger).result()   # read back from the ledger
    assert isinstance(out, pa.Table) and out.column("twice").to_pylist() == [2, 4]
    con = duckdb.connect(ledger, read_only=True)
    uri = con.execute("SELECT uri FROM results WHERE run_id = ? AND task_key = 'frame'",
                      [run.run_id]).fetchall()[0][0]
    path = Path(ledger + ".d") / uri
    assert path.suffix == ".parquet"
    assert con.execute(f"SELECT sum(twice) FROM read_parquet('{path}')").fetchall() == [(6,)]
    con.close()


def test_lineage_is_plain_sql(ledger: str) -> None:
    @task
    def a() -> int:
        return 1

    @task
    def b(x: int) -> int:
        ledgerflow.context().record_output("file://out.txt", "abc123", rows="1")
        return x + 1

    @pipeline
    def p():
        return b(a())

    run = p.run(store=ledger, executor="inline").settle()   # (SQL in the process that ran it)
    con = duckdb.connect(ledger, read_only=True)
    rows = con.execute("SELECT direction, uri, content_hash FROM lineage WHERE run_id = ? AND "
                       "task_key = 'b' ORDER BY direction, uri", [run.run_id]).fetchall()
    con.close()
    hashes = {t.key: t.result_hash for t in run.status().tasks.values()}
    assert ("input", "task:a", hashes["a"]) in rows
    assert ("output", "task:b", hashes["b"]) in rows
    assert ("output", "file://out.txt", "abc123") in rows


def test_a_superseded_driver_cannot_write(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.duckdb")
    old = DuckDBStore(path)
    now = time.time()
    lease = old.create_run("r1", [RunDefined("r1", "p", None, "{}", now, "{}"),
                                  RunStateChanged("running", "", now)])
    # the old driver "dies": its lease now names a process that does not exist
    lease_file = Path(path + ".d") / "runs" / "r1" / "lease"
    doc = json.loads(lease_file.read_text())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    old._beats["r1"].stop()     # the old driver is gone: its heartbeat stops and the
    old.journals.stop("r1")     # lock on its journal goes with its file descriptor
    lease_file.write_text(json.dumps({**doc, "pid": int(dead), "start": None}))
    new = DuckDBStore(path)
    taken = new.take_over("r1")
    assert taken.token == 2
    # what the old driver still writes to its segment is never applied
    with open(old.journals.path("r1", 1), "ab") as seg:
        seg.write(encode_line([RunStateChanged("failed", "stale write", now)]))
    new.append(taken, [RunStateChanged("succeeded", "", now + 1)])
    # told while the run is held, before any fold has seen the stale write
    told = new.notices("r1")
    assert [n["kind"] for n in told] == ["stale_driver_rejected"]
    assert "rejected 1 record(s)" in told[0]["message"]
    new.release(taken)
    view = new.get_run("r1")
    assert view.state == "succeeded"
    assert new.notices("r1") == told     # folded or not: the same notice, once
    new.settle("r1")
    assert new.notices("r1") == told
    # and its heartbeat notices the takeover, after which its appends are refused
    old._beats["r1"] = beat = Heartbeat(old.leases, "r1", 1,
                                        lambda: old.journals.newest_token("r1"))
    beat.beat()
    assert beat.fenced
    old.journals.start("r1", 1)      # even with its segment open again, it cannot write
    with pytest.raises(LeaseLostError):
        old.append(lease, [RunStateChanged("failed", "stale", now)])


def test_spec_file_in_toml(tmp_path: Path, ledger: str) -> None:
    (tmp_path / "spec_tasks.py").write_text(
        "from ledgerflow import task\n"
        "@task\ndef make(n: int) -> list:\n    return list(range(n))\n"
        "@task\ndef count(items: list) -> int:\n    return len(items)\n")
    spec = tmp_path / "flow.toml"
    spec.write_text('name = "counting"\n'
                    '[tasks.make]\ntask = "spec_tasks:make"\nargs = { n = 4 }\n'
                    '[tasks.count]\ntask = "spec_tasks:count"\ninputs = { items = "make" }\n')
    run = ledgerflow.run(str(spec), store=ledger, executor="inline")
    assert run.state == "succeeded" and run.result("count") == 4
    assert ledgerflow.runs(store=ledger)[0].pipeline == "counting"


def test_a_live_driver_is_not_taken_over_when_its_lease_file_is_deleted(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.duckdb")
    driver = DuckDBStore(path)
    now = time.time()
    lease = driver.create_run("r1", [RunDefined("r1", "p", None, "{}", now, "{}"),
                                     RunStateChanged("running", "", now)])
    (Path(path + ".d") / "runs" / "r1" / "lease").unlink()
    other = DuckDBStore(path)
    assert other.driver_alive("r1")          # its journal lock still says so
    with pytest.raises(ledgerflow.NotResumableError, match="still being driven"):
        other.take_over("r1")
    driver._beats["r1"].beat()               # the heartbeat writes the lease back
    assert (Path(path + ".d") / "runs" / "r1" / "lease").exists()
    driver.append(lease, [RunStateChanged("succeeded", "", now + 1)])
    driver.release(lease)
    assert other.get_run("r1").state == "succeeded"


def test_a_renewal_in_progress_when_the_lease_is_released_writes_no_lease_after_it(
        tmp_path: Path) -> None:
    """The driver stops the heartbeat, then removes its lease: a renewal that was
    writing meanwhile must not put the lease back (a live pid's lease refuses resumes)."""
    import threading

    from ledgerflow_stores.duckdb.lease import Leases

    leases = Leases(tmp_path / "runs")
    real = leases.write
    writing = threading.Event()

    def slow(run_id: str, token: int) -> None:
        writing.set()
        time.sleep(0.5)
        real(run_id, token)

    leases.write = slow     # type: ignore[method-assign]
    beat = Heartbeat(leases, "r1", 1)
    assert writing.wait(30), "no renewal started"
    beat.stop()                         # waits for the renewal in progress
    assert not beat._thread.is_alive()  # so nothing can write the lease after this
    leases.remove("r1", 1)
    assert leases.read("r1") is None
