"""Issue 31 #8: a key a tool's exception (or result, or a provider's error) quotes is stored
nowhere and never sent to the model, whatever ``record_content`` says."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest

from ledgerflow import pipeline
from ledgerflow_agents import MockModel, agent_task, tool

PLANTED = "sk-planted-4f1e9b2c7d-never-stored"
ALIAS = "LF_PLANTED_API_KEY"


@tool
def lookup(name: str) -> str:
    """Look a name up in the partner's service."""
    raise PermissionError(f"partner said: key {os.environ[ALIAS]} may not read {name}")


@tool
def echo_config(name: str) -> str:
    """Return the service's configuration."""
    return f"config of {name}: token={os.environ[ALIAS]}"


def _tables(ledger: Path) -> str:
    con = duckdb.connect(str(ledger), read_only=True)
    try:
        out = []
        for (table,) in con.execute("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_schema = 'main'").fetchall():
            out.append(repr(con.execute(f'SELECT * FROM "{table}"').fetchall()))
        return "\n".join(out)
    finally:
        con.close()


@pytest.mark.parametrize("record_content", [False, True])
def test_a_planted_key_reaches_no_table_file_or_model_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record_content: bool) -> None:
    monkeypatch.setenv(ALIAS, PLANTED)
    turns = [{"tool_calls": [{"name": "lookup", "arguments": {"name": "ana"}}]},
             {"tool_calls": [{"name": "echo_config", "arguments": {"name": "ana"}}]},
             {"text": "cannot look ana up"}]
    mock = MockModel(turns=turns)

    @agent_task(model=mock, tools=[lookup, echo_config], key=ALIAS,
                record_content=record_content)
    def ask(question: str) -> str:
        return question

    @pipeline
    def flow():
        return ask("who is ana?")

    ledger = tmp_path / "ledger.duckdb"
    run = flow.run(store=str(ledger)).settle()   # (its tables read as plain SQL)
    assert run.result() == "cannot look ana up"
    calls = run.tool_calls()
    assert [c["outcome"] for c in calls] == ["error", "ok"]
    assert f"[redacted {ALIAS}]" in calls[0]["error"]        # still says what went wrong
    sent = json.dumps(mock.requests, default=str)
    assert f"[redacted {ALIAS}]" in sent and PLANTED not in sent
    dumped = json.dumps([run.lineage(), run.logs("ask"), run.usage(), run.notices(),
                         run.model_calls(), calls, run.attempts()], default=str)
    assert PLANTED not in dumped
    assert PLANTED not in _tables(ledger)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert PLANTED.encode() not in path.read_bytes(), path
