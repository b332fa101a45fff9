"""Archiving a finished run's journal off the release's path: what this process and
others see while it happens."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

import pytest

from ledgerflow_stores.duckdb import journal
from ledgerflow_stores.duckdb.journal import Journals


def _segment(folder: Path, name: str, lines: int) -> Path:
    path = folder / name
    path.write_bytes(b"".join(b'[["X",%d]]\n' % i for i in range(lines)))
    return path


def test_a_token_found_live_and_archived_is_read_from_its_archive(tmp_path: Path) -> None:
    """Another process archiving it right now: the archive is complete once there, the
    live file may go at any moment."""
    journals = Journals(tmp_path)
    _segment(tmp_path, "r.1.jsonl", 3)
    (tmp_path / "r.1.jsonl.gz").write_bytes(gzip.compress((tmp_path / "r.1.jsonl").read_bytes()))
    _segment(tmp_path, "r.2.jsonl", 2)
    assert journals.every_segment("r") == [(1, tmp_path / "r.1.jsonl.gz"),
                                           (2, tmp_path / "r.2.jsonl")]


def test_archiving_soon_is_seen_done_by_every_listing_of_this_process(tmp_path: Path) -> None:
    live = _segment(tmp_path, "r.1.jsonl", 200_000)
    data = live.read_bytes()
    Journals(tmp_path).archive_soon("r")
    other = Journals(tmp_path)              # another store of the same ledger
    assert other.segments("r") == []
    ((token, gz),) = other.archived("r")
    assert token == 1 and gzip.decompress(gz.read_bytes()) == data


def test_a_run_being_archived_counts_as_folded_not_live(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _segment(tmp_path, "r.1.jsonl", 3)
    _segment(tmp_path, "s.1.jsonl", 1)
    go = threading.Event()
    real = Journals.archive

    def held(self: Journals, run_id: str, upto: int | None = None) -> None:   # held
        go.wait()
        real(self, run_id, upto)
    monkeypatch.setattr(Journals, "archive", held)
    journals = Journals(tmp_path)
    journals.archive_soon("r")
    assert (tmp_path / "r.1.jsonl").exists()
    assert journals.runs() == {"s"}
    go.set()
    journals.settle()
    assert journals.runs() == {"s"} and journals.all_runs() == {"r", "s"}
    assert not (tmp_path / "r.1.jsonl").exists()


def test_an_archiving_that_fails_leaves_the_journal_live_for_the_next_fold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    live = _segment(tmp_path, "r.1.jsonl", 3)
    real = Journals.archive

    def full(self: Journals, run_id: str, upto: int | None = None) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Journals, "archive", full)
    journals = Journals(tmp_path)
    journals.archive_soon("r")
    journals.settle()
    assert "could not archive the journal of run r" in caplog.text
    assert journals.runs() == {"r"} and journals.segments("r") == [(1, live)]
    monkeypatch.setattr(Journals, "archive", real)
    journals.archive("r")                  # what the next fold does with it
    assert journals.runs() == set() and [t for t, _ in journals.archived("r")] == [1]


def test_a_segment_removed_before_its_archiving_is_skipped(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    live = _segment(tmp_path, "r.1.jsonl", 3)
    journals = Journals(tmp_path)
    listed = journals._glob("r.*.jsonl", "r")
    live.unlink()                       # listed, then removed (its folder on the way out)
    monkeypatch.setattr(Journals, "_glob", lambda self, pattern, run_id: listed)
    journals.archive("r")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_journal_folder_removed_while_it_is_archived_is_not_warned_about(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "journals"
    folder.mkdir()
    _segment(folder, "r.1.jsonl", 3)
    real = journal.private.open_file

    def folder_gone(path: Path, flags: int) -> int:     # read, then the folder went
        (folder / "r.1.jsonl").rename(tmp_path / "kept")
        folder.rmdir()
        return real(path, flags)
    monkeypatch.setattr(journal.private, "open_file", folder_gone)
    caplog.set_level("DEBUG", logger="ledgerflow")
    journals = Journals(folder)
    journals.archive_soon("r")
    journals.settle()
    assert not folder.exists()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert "is gone, nothing to archive" in caplog.text
