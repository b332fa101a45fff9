"""``Task._extra_fingerprint``: what a task subclass adds to its fingerprint reaches the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledgerflow import pipeline
from ledgerflow.task import Task, TaskOptions

CALLS: list[str] = []


def _read(path: str) -> str:
    CALLS.append(path)
    return Path(path).read_text()


class FileTask(Task[..., str]):
    """Reads the file named by its argument; its fingerprint covers the file's bytes."""

    def _extra_fingerprint(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        return Path(args[0]).read_bytes()


read_file = FileTask(_read, TaskOptions(name="read_file", version="1"))


def test_a_changed_input_file_misses_the_cache_and_an_unchanged_one_hits(
        tmp_path: Path, ledger: str) -> None:
    src = tmp_path / "in.txt"
    src.write_text("one")

    @pipeline
    def p(path: str):
        return read_file(path)

    CALLS.clear()
    assert p.run(str(src), store=ledger, executor="inline").result() == "one"
    again = p.run(str(src), store=ledger, executor="inline")
    assert again.result() == "one" and len(CALLS) == 1
    assert again.status().tasks["read_file"].cached_from
    src.write_text("two")
    assert p.run(str(src), store=ledger, executor="inline").result() == "two"
    assert len(CALLS) == 2


def test_the_default_adds_nothing() -> None:
    assert Task(len, TaskOptions())._extra_fingerprint((), {}) == b""
