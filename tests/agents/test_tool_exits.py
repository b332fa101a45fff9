"""Issue 31 #8: a tool that exits (``SystemExit``, as argparse does on a bad flag) or raises
another ``BaseException`` quoting a key leaves that key in no table, file or model request.

Before, only ``Exception`` was redacted: the ``SystemExit`` ended the attempt and its
text, key and all, was the task's stored error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ledgerflow import pipeline
from ledgerflow_agents import MockModel, agent_task, tool
from tests.agents.test_redaction import _tables

PLANTED = "sk-exit-9a8b7c6d5e-never-stored"
ALIAS = "LF_EXIT_API_KEY"


class Stop(BaseException):
    """Not an Exception: it ends the attempt."""


@tool
def partner_cli(flag: str) -> str:
    """Run the partner's command line with one flag."""
    raise SystemExit(f"usage: partner --key {os.environ[ALIAS]}: unknown flag {flag}")


@tool
def halt(flag: str) -> str:
    """Stop everything."""
    raise Stop(f"halted with key {os.environ[ALIAS]}")


def _nowhere(ledger: Path, *texts: str) -> None:
    assert PLANTED not in _tables(ledger)
    for text in texts:
        assert PLANTED not in text
    for path in ledger.parent.rglob("*"):
        if path.is_file():
            assert PLANTED.encode() not in path.read_bytes(), path


def test_a_tool_that_exits_is_an_error_the_model_reads_without_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALIAS, PLANTED)
    mock = MockModel(turns=[{"tool_calls": [{"name": "partner_cli",
                                             "arguments": {"flag": "-x"}}]},
                            {"text": "the flag was wrong"}])

    @agent_task(model=mock, tools=[partner_cli], key=ALIAS, record_content=False)
    def ask(question: str) -> str:
        return question

    @pipeline
    def flow():
        return ask("run it")

    ledger = tmp_path / "ledger.duckdb"
    run = flow.run(store=str(ledger)).settle()   # (its file is read byte by byte)
    assert run.status().state == "succeeded" and run.result() == "the flag was wrong"
    (call,) = run.tool_calls()
    assert call["outcome"] == "error" and call["error"].startswith("SystemExit: usage")
    assert f"[redacted {ALIAS}]" in call["error"]
    sent = json.dumps(mock.requests, default=str)
    assert "unknown flag -x" in sent
    _nowhere(ledger, sent, json.dumps([run.attempts(), run.notices()], default=str))


def test_a_base_exception_from_a_tool_fails_the_attempt_without_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALIAS, PLANTED)
    mock = MockModel(turns=[{"tool_calls": [{"name": "halt", "arguments": {"flag": "-x"}}]},
                            {"text": "never"}])

    @agent_task(model=mock, tools=[halt], key=ALIAS)
    def ask(question: str) -> str:
        return question

    @pipeline
    def flow():
        return ask("run it")

    ledger = tmp_path / "ledger.duckdb"
    run = flow.run(store=str(ledger), executor="threads").settle()
    task = run.status().tasks["ask"]
    assert task.state == "failed" and f"[redacted {ALIAS}]" in (task.error or "")
    _nowhere(ledger, json.dumps(mock.requests, default=str),
             json.dumps([run.attempts(), run.notices()], default=str))
