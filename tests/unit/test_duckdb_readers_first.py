"""A reader waiting for the DuckDB ledger's file is let in by the folds (issue 34 #1)."""

from __future__ import annotations

import subprocess
import sys
import threading

from ledgerflow_stores.duckdb import DuckDBStore, FoldPolicy
from tests.unit.test_duckdb_store import fan
from tests.waiting import wait_until

HOLD = ("import duckdb, sys, time\ncon = duckdb.connect(sys.argv[1])\n"
        "print('held', flush=True)\ntime.sleep(float(sys.argv[2]))\ncon.close()\n")


def _unfolded_run(tmp_path) -> tuple[DuckDBStore, str]:
    store = DuckDBStore(str(tmp_path / "l.duckdb"),
                        policy=FoldPolicy(fold_at_release=False, interval=3600,
                                          batch_bytes=20_000))
    run = fan.run(n=600, store=store, executor="inline")
    return store, run.run_id


def test_a_reader_refused_the_lock_says_it_waits_until_it_gets_in(tmp_path) -> None:
    store, run_id = _unfolded_run(tmp_path)
    readers = tmp_path / "l.duckdb.d" / "readers"
    with subprocess.Popen([sys.executable, "-c", HOLD, store.location, "3"],
                          stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(store.get_run(run_id).state))
        reader.start()
        wait_until(lambda: readers.exists() and any(readers.iterdir()), timeout=30,
                   what="the waiting reader's marker")
        assert store.ledger.waiting.any()
        reader.join(timeout=60)
    assert got == ["failed"]
    assert not any(readers.iterdir()), "the marker outlived the read"
    assert not store.ledger.waiting.any()


def test_a_fold_stops_after_its_batch_while_a_reader_waits_and_lets_it_in_first(
        tmp_path) -> None:
    store, run_id = _unfolded_run(tmp_path)
    with store.ledger.connect(True) as con:
        assert store.folds.run(con, run_id, yield_to=lambda: True)     # one batch, then out
        (n,) = con.execute('SELECT count(*) FROM journal_folds WHERE run_id = ?',
                           [run_id]).fetchone()
        (offset,) = con.execute('SELECT max("offset") FROM journal_folds WHERE run_id = ?',
                                [run_id]).fetchone()
    assert n == 1 and 0 < offset <= 40_000
    waiting = threading.Event()
    done = threading.Event()

    def reader() -> None:
        with store.ledger.waiting.reader():
            waiting.set()
            done.wait(30)
    t = threading.Thread(target=reader)
    t.start()
    waiting.wait(30)
    threading.Timer(1.0, done.set).start()
    store.fold_run(run_id)                    # waits for the reader, then folds it all
    assert done.is_set()                      # it folded only once the reader let go
    t.join(timeout=30)                      # it folded only once the reader let go
    assert store.get_run(run_id).state == "failed"
    with store.ledger.connect(False) as con:
        (left,) = con.execute("SELECT count(*) FROM tasks WHERE run_id = ?", [run_id]).fetchone()
    assert left == 601
