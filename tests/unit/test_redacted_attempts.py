"""A task's own error, traceback and output reach the ledger with known secrets out.

A task that quotes an API key from its environment (in an exception, a print, a
log line) must not put the key in the ledger: the attempt's error, traceback and
captured output say ``[redacted NAME]`` instead, on every executor (the
redaction runs where the attempt runs), and no file of the ledger holds the key.
"""

from __future__ import annotations

import gzip
import logging
import os
from pathlib import Path
from typing import Any

import pytest

import ledgerflow
from ledgerflow import TaskTimedOut, pipeline, task

KEY = "sk-live-7f3a9c1e5b2d4068"


@task(retries=0)
def leaky() -> int:
    key = os.environ["LF_REDACT_TEST_API_KEY"]
    print(f"calling the service with {key}")
    logging.getLogger("leaky").warning("retrying with %s", key)
    raise PermissionError(f"401: key {key} refused")


@pipeline
def leaking():
    return leaky()


def _ledger_bytes(store: str) -> bytes:
    out = Path(store).read_bytes()
    for f in Path(store + ".d").rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            out += gzip.decompress(data) if f.suffix == ".gz" else data
    return out


@pytest.mark.parametrize("executor", ["inline", "threads", "processes"])
def test_a_task_quoting_a_key_leaves_the_key_out_of_the_ledger(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: str) -> None:
    monkeypatch.setenv("LF_REDACT_TEST_API_KEY", KEY)
    store = str(tmp_path / "ledger.duckdb")
    run = leaking.run(store=store, executor=executor, workers=1).settle()   # (files read)
    assert run.state == "failed"
    (attempt,) = ledgerflow.get_run(run.run_id, store=store).attempts("leaky")
    assert attempt["error_message"] == "401: key [redacted LF_REDACT_TEST_API_KEY] refused"
    assert "[redacted LF_REDACT_TEST_API_KEY]" in attempt["traceback"]
    text = "".join(r["text"] for r in run.logs("leaky"))
    assert "calling the service with [redacted LF_REDACT_TEST_API_KEY]" in text
    assert "retrying with [redacted LF_REDACT_TEST_API_KEY]" in text
    assert KEY.encode() not in _ledger_bytes(store)


class _Unsendable:
    def __reduce__(self) -> Any:
        raise TypeError(f"cannot send {os.environ['LF_REDACT_TEST_API_KEY']}")


@task(retries=0)
def timed_out() -> int:
    raise TaskTimedOut(f"gave up waiting with {os.environ['LF_REDACT_TEST_API_KEY']}")


@task(retries=0)
def exits() -> int:
    raise SystemExit(os.environ["LF_REDACT_TEST_API_KEY"])


@task(retries=0)
def unsendable() -> object:
    return _Unsendable()


@pipeline
def other_ends():
    return [timed_out(), exits(), unsendable()]


def test_a_key_in_a_timeout_an_exit_or_an_unsendable_result_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LF_REDACT_TEST_API_KEY", KEY)
    store = str(tmp_path / "ledger.duckdb")
    run = other_ends.run(store=store, executor="inline").settle()
    assert run.state == "failed"
    errors = {a["task_key"]: a["error_message"] for a in run.attempts()}
    assert errors == {
        "timed_out": "gave up waiting with [redacted LF_REDACT_TEST_API_KEY]",
        "exits": "the task raised SystemExit (exit code "
                 "'[redacted LF_REDACT_TEST_API_KEY]'); its attempt failed",
        "unsendable": "result could not be serialised: cannot send "
                      "[redacted LF_REDACT_TEST_API_KEY]"}
    assert KEY.encode() not in _ledger_bytes(store)


def test_an_executor_that_cannot_start_a_job_reports_no_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerflow.executor import not_started

    monkeypatch.setenv("LF_REDACT_TEST_API_KEY", KEY)
    c = not_started(7, ValueError(f"cannot pickle a client holding {KEY}"))
    assert c.error_message == ("executor could not start it: cannot pickle a client "
                               "holding [redacted LF_REDACT_TEST_API_KEY]")


def test_a_short_or_unnamed_value_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerflow.redact import redact

    monkeypatch.setenv("LF_REDACT_SHORT_TOKEN", "abc")          # under 8 characters
    monkeypatch.setenv("LF_REDACT_PLAIN", "sk-live-not-a-named-secret")
    assert redact("abc and sk-live-not-a-named-secret") == \
        "abc and sk-live-not-a-named-secret"
