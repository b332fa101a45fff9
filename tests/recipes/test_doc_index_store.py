"""The index writes: idempotent, concurrent (threads and processes), pruned, explained."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import doc_index_store as store
import pytest
from doc_index_testutil import ROOT, make_table, query, rows

from ledgerflow import NonRetryableError

TEXTS = ["The first chunk talks about apples.", "The second one is about pears.",
         "A third chunk mentions plums and apples."]


def _consistent(index: Path) -> None:
    """No duplicate keys; postings exactly cover the chunks."""
    dup = query(index, "SELECT doc_id, position, count(*) FROM chunks GROUP BY ALL "
                       "HAVING count(*) > 1")
    assert dup == []
    orphan = query(index, "SELECT count(*) FROM postings p ANTI JOIN chunks c "
                          "USING (doc_id, position)")
    missing = query(index, "SELECT count(*) FROM chunks c ANTI JOIN postings p "
                           "USING (doc_id, position)")
    assert orphan == [(0,)] and missing == [(0,)]


def test_write_twice_is_idempotent(tmp_path: Path, recipe) -> None:
    index = tmp_path / "i.duckdb"
    table = make_table("a.txt", TEXTS)
    first = recipe.update_index(table, index=str(index))
    snapshot = rows(index, "doc_id, position, content_hash, text, written_at")
    second = recipe.update_index(table, index=str(index))
    assert first == second == {"doc_id": "a.txt", "doc_hash": "h0", "chunks": 3,
                               "index": str(index)}
    assert rows(index, "doc_id, position, content_hash, text, written_at") == snapshot
    assert len(snapshot) == 3
    _consistent(index)


def test_edit_rewrites_only_changed_chunks(tmp_path: Path) -> None:
    index = tmp_path / "i.duckdb"
    store.write_document(index, make_table("a.txt", TEXTS),
                         provenance=store.Provenance("run1", "update_index[a.txt]", 1, "k1"))
    edited = [*TEXTS[:2], "A replaced third chunk."]
    result = store.write_document(
        index, make_table("a.txt", edited, doc_hash="h1"),
        provenance=store.Provenance("run2", "update_index[a.txt]", 1, "k2"))
    assert (result.inserted, result.deleted, result.skipped) == (1, 1, False)
    got = rows(index, "position, text, doc_hash, run_id")
    assert got == [(0, TEXTS[0], "h1", "run1"), (1, TEXTS[1], "h1", "run1"),
                   (2, "A replaced third chunk.", "h1", "run2")]
    shorter = store.write_document(index, make_table("a.txt", TEXTS[:1], doc_hash="h2"))
    assert (shorter.inserted, shorter.deleted) == (0, 2)
    assert rows(index, "position, doc_hash") == [(0, "h2")]
    _consistent(index)


def test_retry_after_crash_post_commit_is_a_noop(tmp_path: Path) -> None:
    """Attempt 1 committed its write but 'crashed' before the ledger knew; attempt 2 retries."""
    index = tmp_path / "i.duckdb"
    table = make_table("a.txt", TEXTS)
    first = store.write_document(
        index, table, provenance=store.Provenance("run1", "update_index[a.txt]", 1, "idem-1"))
    retry = store.write_document(
        index, table, provenance=store.Provenance("run1", "update_index[a.txt]", 2, "idem-1"))
    assert not first.skipped and retry.skipped
    assert first.as_dict() == retry.as_dict()  # the task result does not depend on the retry
    assert rows(index, "position, attempt") == [(0, 1), (1, 1), (2, 1)]
    assert query(index, "SELECT idempotency_key, attempt, chunks FROM writes") == [
        ("idem-1", 1, 3)]


def test_retry_with_lost_write_writes_everything(tmp_path: Path) -> None:
    """Attempt 1 crashed before its commit: nothing was written; attempt 2 writes it all."""
    index = tmp_path / "i.duckdb"
    table = make_table("a.txt", TEXTS)

    def crash(con) -> None:
        con.execute("SELECT 1").fetchall()
        raise RuntimeError("worker died mid-transaction")

    store.write_document(index, make_table("other.txt", ["x y"]))  # the index exists
    with pytest.raises(RuntimeError):
        store.transaction(index, crash)
    retry = store.write_document(
        index, table, provenance=store.Provenance("run1", "update_index[a.txt]", 2, "idem-1"))
    assert not retry.skipped
    assert [r for r in rows(index, "doc_id, position, attempt") if r[0] == "a.txt"] == [
        ("a.txt", 0, 2), ("a.txt", 1, 2), ("a.txt", 2, 2)]


def test_concurrent_writes_from_threads(tmp_path: Path) -> None:
    index = tmp_path / "i.duckdb"
    tables = [make_table(f"doc{i:02d}.txt", [f"document {i} chunk {j} words" for j in range(4)])
              for i in range(12)]
    errors: list[BaseException] = []

    def worker(offset: int) -> None:
        try:
            for k in range(len(tables)):
                store.write_document(index, tables[(k + offset) % len(tables)])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i * 3,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(rows(index)) == 12 * 4  # every doc written 4 times, stored once
    _consistent(index)


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import doc_index_testutil  # puts the recipe folder on sys.path
    import doc_index_store as store
    index, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    tables = [doc_index_testutil.make_table(f"doc{{i:02d}}.txt",
              [f"document {{i}} chunk {{j}}" for j in range(3)]) for i in range(first, last)]
    print("ready", flush=True)
    sys.stdin.readline()
    for t in tables:
        store.write_document(index, t)
    print("done", flush=True)
""")


def test_concurrent_writes_from_two_processes(tmp_path: Path) -> None:
    """Two processes write overlapping documents; the file lock is retried, nothing lost."""
    index = tmp_path / "i.duckdb"
    script = CHILD.format(tests=str(ROOT / "tests" / "recipes"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(index), str(a), str(b)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for a, b in ((0, 14), (6, 20))]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:  # start both at once
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip() == "done"
    got = rows(index, "doc_id, position")
    assert got == [(f"doc{i:02d}.txt", j) for i in range(20) for j in range(3)]
    _consistent(index)


def test_lock_held_by_another_process_is_waited_for(tmp_path: Path) -> None:
    index = tmp_path / "i.duckdb"
    store.write_document(index, make_table("a.txt", TEXTS))
    releasing = tmp_path / "releasing"
    with subprocess.Popen(
            [sys.executable, "-c", "import duckdb, pathlib, sys, time; "
             "c = duckdb.connect(sys.argv[1]); print('held', flush=True); time.sleep(1.0); "
             "pathlib.Path(sys.argv[2]).touch(); c.close()", str(index), str(releasing)],
            stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        store.write_document(index, make_table("b.txt", TEXTS))
        assert releasing.exists()   # it got in only once the holder let go: it waited
    assert len(rows(index)) == 6


def test_lock_timeout_gives_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    index = tmp_path / "i.duckdb"
    store.write_document(index, make_table("a.txt", TEXTS))
    monkeypatch.setenv("LEDGERFLOW_INDEX_LOCK_TIMEOUT", "0.3")
    with subprocess.Popen(
            [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
             "print('held', flush=True); time.sleep(3)", str(index)],
            stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            with pytest.raises(store.IndexLockedError, match="another process"):
                store.write_document(index, make_table("b.txt", TEXTS))
        finally:
            holder.kill()


def test_embedder_mismatch_is_refused(tmp_path: Path, recipe) -> None:
    index = tmp_path / "i.duckdb"
    store.write_document(index, make_table("a.txt", TEXTS))
    other = make_table("b.txt", TEXTS)
    other = other.set_column(other.schema.get_field_index("embedder_version"),
                             "embedder_version", [["hashing-v0"] * 3])
    with pytest.raises(store.IndexMismatchError, match="was built with embedder 'hashing'"):
        store.write_document(index, other)
    with pytest.raises(NonRetryableError, match="hashing-v0"):
        recipe.update_index(other, index=str(index))
    assert {r[0] for r in rows(index)} == {"a.txt"}


def test_one_write_takes_one_document(tmp_path: Path) -> None:
    import pyarrow as pa

    both = pa.concat_tables([make_table("a.txt", TEXTS), make_table("b.txt", TEXTS)])
    with pytest.raises(store.IndexMismatchError, match="one document"):
        store.write_document(tmp_path / "i.duckdb", both)


def test_empty_document_removes_its_rows(tmp_path: Path) -> None:
    index = tmp_path / "i.duckdb"
    store.write_document(index, make_table("a.txt", TEXTS))
    store.write_document(index, make_table("b.txt", TEXTS))
    result = store.write_document(index, make_table("a.txt", [], doc_hash="h9"))
    assert (result.doc_id, result.deleted) == ("a.txt", 3)
    assert {r[0] for r in rows(index)} == {"b.txt"}
    _consistent(index)


def test_prune_removes_deleted_and_stale_documents(tmp_path: Path, recipe) -> None:
    index = tmp_path / "i.duckdb"
    for name in ("a.txt", "b.txt", "c.txt"):
        store.write_document(index, make_table(name, TEXTS, doc_hash=f"hash-{name}"))
    docs = [{"doc_id": "a.txt", "content_hash": "hash-a.txt"},
            {"doc_id": "b.txt", "content_hash": "changed"}]
    result = recipe.prune(str(index), docs)
    assert result["deleted_documents"] == ["c.txt"]
    assert result["deleted_chunks"] == 6 and result["chunks"] == 3
    assert {r[0] for r in rows(index)} == {"a.txt"}
    assert query(index, "SELECT DISTINCT doc_id FROM writes") == [("a.txt",)]
    _consistent(index)
    again = recipe.prune(str(index), docs)
    assert again["deleted_chunks"] == 0 and again["chunks"] == 3


def test_prune_of_a_missing_index_creates_nothing(tmp_path: Path, recipe) -> None:
    result = recipe.prune(str(tmp_path / "none.duckdb"), [])
    assert result["chunks"] == 0 and not (tmp_path / "none.duckdb").exists()


def test_explain_gives_item_level_lineage(tmp_path: Path) -> None:
    index = tmp_path / "i.duckdb"
    table = make_table("a.txt", TEXTS, doc_hash="dochash")
    store.write_document(index, table,
                         provenance=store.Provenance("run-7", "update_index[a.txt]", 2, "k"))
    info = store.explain(index, "a.txt", 1)
    assert info["doc_id"] == "a.txt" and info["position"] == 1
    assert info["source"] == "/docs/a.txt" and info["doc_hash"] == "dochash"
    assert info["content_hash"] == table.column("content_hash")[1].as_py()
    assert info["text"] == TEXTS[1]
    assert info["embedder"] == "hashing" and info["embedder_version"].startswith("hashing-v1")
    assert (info["run_id"], info["task_key"], info["attempt"]) == (
        "run-7", "update_index[a.txt]", 2)
    assert info["written_at"].endswith("Z")
    with pytest.raises(store.ChunkNotFoundError, match=r"positions 0-2"):
        store.explain(index, "a.txt", 9)
    with pytest.raises(store.ChunkNotFoundError, match="not in the index"):
        store.explain(index, "zzz", 0)
    with pytest.raises(store.IndexNotFoundError):
        store.explain(tmp_path / "missing.duckdb", "a.txt", 0)


def test_index_info(tmp_path: Path) -> None:
    index = tmp_path / "i.duckdb"
    store.write_document(index, make_table("a.txt", TEXTS))
    info = store.index_info(index)
    assert (info["embedder"], info["dim"], info["documents"], info["chunks"]) == (
        "hashing", 384, 1, 3)
    assert os.path.exists(index)


def test_a_file_that_is_not_an_index_is_refused(tmp_path: Path, recipe) -> None:
    import duckdb

    ledger = tmp_path / "other.duckdb"
    con = duckdb.connect(str(ledger))
    con.execute("CREATE TABLE runs (id INTEGER)")
    con.close()
    with pytest.raises(store.IndexMismatchError, match="not a doc_index index"):
        store.write_document(ledger, make_table("a.txt", TEXTS))
    text_file = tmp_path / "notes.txt"
    text_file.write_text("just text, not a database")
    with pytest.raises(NonRetryableError, match="cannot open"):
        recipe.open_index(str(text_file), "hashing", "v", 384)
    assert text_file.read_text() == "just text, not a database"


def test_bulk_writer_matches_single_writes(tmp_path: Path) -> None:
    tables = [make_table(f"d{i}.txt", [f"doc {i} chunk {j} text" for j in range(3)])
              for i in range(5)]
    one, bulk = tmp_path / "one.duckdb", tmp_path / "bulk.duckdb"
    for t in tables:
        store.write_document(one, t)
    with store.bulk_writer(bulk) as writer:
        results = [writer.write(t) for t in tables]
        assert writer.write(tables[0]).inserted == 0  # idempotent here too
    assert [r.inserted for r in results] == [3] * 5
    columns = "doc_id, position, content_hash, text, embedding, n_terms"
    assert rows(one, columns) == rows(bulk, columns)
    _consistent(bulk)


def test_the_index_file_lock_queues_processes(tmp_path: Path, monkeypatch) -> None:
    """Another process holding INDEX.lock (filelock) is waited for, up to the timeout."""
    index = tmp_path / "i.duckdb"
    store.write_document(index, make_table("a.txt", TEXTS))
    monkeypatch.setenv("LEDGERFLOW_INDEX_LOCK_TIMEOUT", "0.3")
    holder_code = ("import filelock, sys, time; lock = filelock.FileLock(sys.argv[1]); "
                   "lock.acquire(); print('held', flush=True); sys.stdin.readline()")
    with subprocess.Popen([sys.executable, "-c", holder_code, f"{index}.lock"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        try:
            assert holder.stdout.readline().strip() == "held"
            with pytest.raises(store.IndexLockedError, match="could not lock") as err:
                store.write_document(index, make_table("b.txt", TEXTS))
            assert "LEDGERFLOW_INDEX_LOCK_TIMEOUT" in err.value.hint
            assert len(rows(index)) == 3          # nothing was written meanwhile
        finally:
            holder.stdin.write("release\n")
            holder.stdin.flush()
    store.write_document(index, make_table("b.txt", TEXTS))   # free again
    assert len(rows(index)) == 6

