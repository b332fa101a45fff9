"""``@task(verify=fn)``: a cached result of an effect is reused only while its check passes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import NonRetryableError, hookimpl, pipeline, task
from ledgerflow.errors import DefinitionError
from ledgerflow.plugins import get_plugin_manager

CHECKS: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
MODE = {"verify": "check"}   # "check" | "raise" | "exit"


def _file_written(result: Any, folder: str, name: str) -> bool:
    CHECKS.append((result, (folder, name), {}))
    if MODE["verify"] == "raise":
        raise OSError("the sink is unreachable")
    if MODE["verify"] == "exit":
        sys.exit(4)                  # user code in the driver: must not stop it
    return (Path(folder) / name).is_file() and (Path(folder) / name).read_text() == result


@task(verify=_file_written)
def write_file(folder: str, name: str) -> str:
    """An effect on the outside world: a file; its result names what was written."""
    (Path(folder) / name).write_text(f"content of {name}")
    with open(Path(folder) / "calls.log", "a") as log:
        log.write(name + "\n")
    return f"content of {name}"


@task
def maybe_fail(folder: str, _written: str) -> str:
    if (Path(folder) / "fail").exists():
        raise NonRetryableError("told to fail")
    return "ok"


@pipeline
def sink(folder: str) -> str:
    written = write_file(folder, "out.txt")
    return maybe_fail(folder, written)


class Transitions:
    """Records every task transition of the runs in this process."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str]] = []

    @hookimpl
    def ledgerflow_task_state_changed(self, run_id: str, task_key: str, old: str | None,
                                      new: str, attempt: int, reason: str) -> None:
        self.seen.append((run_id, task_key, new, reason))

    def reasons(self, run: ledgerflow.Run, key: str, state: str) -> list[str]:
        return [r for run_id, k, s, r in self.seen if run_id == run.run_id and k == key
                and s == state]


@pytest.fixture()
def transitions() -> Iterator[Transitions]:
    recorder = Transitions()
    pm = get_plugin_manager()
    pm.register(recorder, name="test_verify_transitions")
    CHECKS.clear()
    MODE["verify"] = "check"
    yield recorder
    pm.unregister(recorder)


def _calls(folder: Path) -> list[str]:
    log = folder / "calls.log"
    return log.read_text().split() if log.exists() else []


def test_cached_effect_is_reused_while_its_check_passes(tmp_path: Path, ledger: str,
                                                        transitions: Transitions) -> None:
    first = sink.run(str(tmp_path), store=ledger)
    assert first.state == "succeeded" and _calls(tmp_path) == ["out.txt"]
    assert CHECKS == []                       # nothing cached yet: nothing to verify

    second = sink.run(str(tmp_path), store=ledger)
    assert second.state == "succeeded" and _calls(tmp_path) == ["out.txt"]
    assert CHECKS == [("content of out.txt", (str(tmp_path), "out.txt"), {})]
    (row,) = [t for t in second.tasks() if t["task"] == "write_file"]
    assert row["cached"] is True


def test_a_vanished_effect_is_redone(tmp_path: Path, ledger: str,
                                     transitions: Transitions) -> None:
    sink.run(str(tmp_path), store=ledger)
    (tmp_path / "out.txt").unlink()           # someone removed the effect

    again = sink.run(str(tmp_path), store=ledger)
    assert again.state == "succeeded"
    assert _calls(tmp_path) == ["out.txt", "out.txt"]
    assert (tmp_path / "out.txt").read_text() == "content of out.txt"
    (row,) = [t for t in again.tasks() if t["task"] == "write_file"]
    assert row["cached"] is False and row["attempts"] == 1
    (reason,) = transitions.reasons(again, "write_file", "running")
    assert "cache hit rejected by verify: _file_written returned False" in reason
    assert first_run_id(ledger) in reason     # names the run whose result was rejected


def test_a_check_that_raises_rejects_the_hit(tmp_path: Path, ledger: str,
                                             transitions: Transitions) -> None:
    sink.run(str(tmp_path), store=ledger)
    MODE["verify"] = "raise"
    again = sink.run(str(tmp_path), store=ledger)
    assert again.state == "succeeded" and _calls(tmp_path) == ["out.txt", "out.txt"]
    (reason,) = transitions.reasons(again, "write_file", "running")
    assert "cache hit rejected by verify: OSError: the sink is unreachable" in reason


def test_a_check_that_exits_rejects_the_hit_and_the_driver_goes_on(
        tmp_path: Path, ledger: str, transitions: Transitions) -> None:
    sink.run(str(tmp_path), store=ledger)
    MODE["verify"] = "exit"
    again = sink.run(str(tmp_path), store=ledger)
    assert again.state == "succeeded" and _calls(tmp_path) == ["out.txt", "out.txt"]
    (reason,) = transitions.reasons(again, "write_file", "running")
    assert "cache hit rejected by verify: SystemExit: 4" in reason


def test_successes_kept_by_a_resume_are_not_verified_again(tmp_path: Path, ledger: str,
                                                           transitions: Transitions) -> None:
    (tmp_path / "fail").touch()
    failed = sink.run(str(tmp_path), store=ledger)
    assert failed.state == "failed"
    (tmp_path / "fail").unlink()
    (tmp_path / "out.txt").unlink()           # the check would fail now
    resumed = ledgerflow.resume(failed.run_id, store=ledger)
    assert resumed.state == "succeeded"
    assert CHECKS == [] and _calls(tmp_path) == ["out.txt"]


def test_verify_must_be_callable() -> None:
    with pytest.raises(DefinitionError, match="verify must be a function"):
        task(verify="yes")(lambda: None)  # type: ignore[arg-type]


def first_run_id(ledger: str) -> str:
    return ledgerflow.runs(store=ledger)[-1].run_id
