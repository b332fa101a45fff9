"""``pipeline watch`` keeps the doc index equal to a from-scratch build, re-embedding only
what changed: edits, deletes, a restore, a rename and bursts, then a kill -9 mid-run and
a restart that catches up (real subprocesses, the ``hashing`` embedder)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from .helpers import DOC_INDEX, ROOT, Watcher, env_for, wait_for

pytest.importorskip("watchfiles")

MARKDOWN = ROOT / "recipes" / "doc_index" / "corpus" / "markdown"
CORPUS = ROOT / "recipes" / "doc_index" / "corpus"
ROWS = "SELECT doc_id, position, text, content_hash, doc_hash, source, embedding FROM chunks " \
       "ORDER BY doc_id, position"


def index_rows(index: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(index), read_only=True)
    try:
        return con.sql(ROWS).fetchall()
    finally:
        con.close()


def scratch_rows(folder: Path, src: Path, n: int) -> list[tuple[Any, ...]]:
    """The index a from-scratch build of ``src`` makes (its own ledger and index)."""
    fresh = folder / f"fresh{n}"
    fresh.mkdir()
    env = {**env_for(folder), "LEDGERFLOW_STORE": str(fresh / "ledger.duckdb")}
    done = subprocess.run([sys.executable, "-m", "ledgerflow", "run", str(DOC_INDEX),
                           "-p", f"source={src}", "-p", f"index={fresh / 'index.duckdb'}"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return index_rows(fresh / "index.duckdb")


def embedded(folder: Path, run_ids: list[str]) -> set[str]:
    """The documents whose ``embed`` ran (not reused) in these runs."""
    from ledgerflow.opening import open_ledger
    st = open_ledger(str(folder / "ledger.duckdb"))
    out: set[str] = set()
    for run_id in run_ids:
        for t in st.get_run(run_id).tasks.values():
            if t.task_name == "embed" and t.cached_from is None and t.attempts:
                out.add(t.key[len("embed["):-1])
    return out


class Settle:
    """After changes: wait until runs covering every changed path ended, none pending."""

    def __init__(self, folder: Path, src: Path, w: Watcher) -> None:
        self.folder, self.src, self.w, self.checks = folder, src, w, 0

    def __call__(self, changed: set[str], expect_embedded: set[str]) -> list[str]:
        want = {str((self.src / name).resolve()) for name in changed}
        runs: list[str] = []
        while True:
            end = self.w.next_end()
            assert end["state"] == "succeeded", end
            assert end["trigger"]["kind"] == "files", end
            runs.append(end["run_id"])
            want -= set(end["trigger"]["paths"])
            if not want and not end["pending"]:
                break
        assert embedded(self.folder, runs) == expect_embedded
        self.checks += 1
        assert index_rows(self.folder / "index.duckdb") == \
            scratch_rows(self.folder, self.src, self.checks)
        return runs


def start(folder: Path, src: Path) -> Watcher:
    return Watcher(folder, str(DOC_INDEX), "-p", f"source={src}", "-p",
                   f"index={folder / 'index.duckdb'}", "--debounce", "0.6s")


def test_edits_deletes_restore_and_rename_keep_the_index_fresh(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(MARKDOWN, src)
    names = sorted(p.name for p in src.iterdir())
    a, b, c, d, e, f = names[:6]
    w = start(tmp_path, src)
    try:
        first = w.next_end()
        assert first["state"] == "succeeded" and first["trigger"]["kind"] == "start"
        assert embedded(tmp_path, [first["run_id"]]) == set(names)
        settle = Settle(tmp_path, src, w)

        for i in range(3):                               # a burst of saves of one file
            with open(src / a, "a") as fh:
                fh.write(f"\nA new closing line, take {i}.\n")
        (src / b).write_text((src / b).read_text() + "\nAnother edited paragraph.\n")
        settle({a, b}, {a, b})

        kept = (src / c).read_bytes()
        (src / c).unlink()
        settle({c}, set())

        (src / c).write_bytes(kept)                      # restored: its embedding is reused
        settle({c}, set())

        (src / d).rename(src / f"renamed-{d}")
        settle({d, f"renamed-{d}"}, {f"renamed-{d}"})

        (src / e).write_text((src / e).read_text() + "\nEdited in a burst.\n")
        (src / f).unlink()
        (src / "new-note.md").write_text("# A new note\n\nWritten while watching.\n")
        settle({e, f, "new-note.md"}, {e, "new-note.md"})
    finally:
        code = w.stop()
    assert code == 0
    assert len([x for x in w.seen if x["event"] == "start"]) == \
        len([x for x in w.seen if x["event"] == "end"])


def test_a_killed_watcher_loses_nothing_on_restart(tmp_path: Path) -> None:
    from ledgerflow.opening import open_ledger
    src = tmp_path / "src"
    for copy in ("one", "two"):                          # 90 documents: a run of seconds
        shutil.copytree(CORPUS, src / copy, ignore=shutil.ignore_patterns("SOURCES.md"))
    w = start(tmp_path, src)
    begun = w.next_event()
    assert begun["event"] == "start"
    run_id = begun["run_id"]
    st = open_ledger(str(tmp_path / "ledger.duckdb"))

    def some_done() -> bool:
        try:
            view = st.get_run(run_id)
        except Exception:       # not recorded yet
            return False
        return any(t.state == "succeeded" and t.task_name == "read"
                   for t in view.tasks.values())

    wait_for(some_done, 120, "the first run to read a document")
    w.kill()                                             # kill -9, mid-run
    view = st.get_run(run_id)
    assert view.state == "running" and not view.driver_alive
    left = [t for t in view.tasks.values() if t.state != "succeeded"]
    assert left, "the run ended before the kill"
    edited = sorted(p for p in (src / "one" / "markdown").iterdir())[0]
    edited.write_text(edited.read_text() + "\nChanged while no watcher ran.\n")

    again = start(tmp_path, src)
    try:
        end = again.next_end()
        assert end["state"] == "succeeded" and end["trigger"]["kind"] == "start"
        assert index_rows(tmp_path / "index.duckdb") == scratch_rows(tmp_path, src, 1)
        assert f"one/markdown/{edited.name}" in embedded(tmp_path, [end["run_id"]])
        from ledgerflow.explain import explain_run
        said = explain_run(st, end["run_id"])
        assert said.against == run_id                    # compared with the killed run
        unfinished = [t for t in said.tasks if t.reason == "failed_before"]
        assert unfinished and all("did not finish" in t.detail for t in unfinished)
    finally:
        assert again.stop() == 0
