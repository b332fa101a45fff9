"""What the model can correct goes back to it (bounded); what cannot be retried is not.

Invalid tool calls and wrong final answers are sent back as errors at most
``corrections`` times; a deterministic model's unusable answer is not retried
as it was; a function that returns no prompt fails once; typed outputs; agent
tasks uncached unless asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ledgerflow import pipeline
from ledgerflow.errors import DefinitionError
from ledgerflow_agents import Arg, MockModel, agent_task, tool
from ledgerflow_agents.output import parse_output


@tool
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@dataclass
class Sum:
    total: int
    explanation: str


def _store(tmp_path: Path) -> str:
    return str(tmp_path / "ledger.duckdb")


def _ask(tmp_path: Path, mock: MockModel, **options: Any) -> Any:
    """Run an agent task ``adder`` (tool: ``add``) asked "2 + 3?" with ``options``."""
    @agent_task(model=mock, tools=[add], **options)
    def adder(question: str) -> str:
        return question

    @pipeline
    def flow():
        return adder("2 + 3?")

    return flow.run(store=_store(tmp_path))


def _kinds(run: Any) -> list[str]:
    return [n["kind"] for n in run.notices()]


def test_invalid_arguments_are_corrected_at_most_corrections_times(tmp_path: Path) -> None:
    bad = {"tool_calls": [{"name": "add", "arguments": {"a": "two", "b": 3}}]}
    mock = MockModel(turns=[bad, bad, {"text": "never reached"}])

    run = _ask(tmp_path, mock, corrections=1, retries=2)
    row = run.status().tasks["adder"]
    assert row.state == "failed" and row.attempts == 1 and "ToolNotAllowed" in row.error
    assert "invalid arguments after 1 correction" in row.error
    assert [c["outcome"] for c in run.tool_calls()] == ["invalid", "invalid"]
    assert len(mock.requests) == 2


def test_a_deterministic_models_malformed_answer_is_sent_back_not_repeated(
        tmp_path: Path) -> None:
    mock = MockModel(turns=[{"fault": "malformed"}, {"text": "5"}], deterministic=True)

    run = _ask(tmp_path, mock)
    assert run.result() == "5"
    second = mock.requests[1]["request"]["messages"]
    assert second[-1]["role"] == "user" and "could not be used" in second[-1]["content"]
    assert second[:-1] == mock.requests[0]["request"]["messages"]   # the error is the change
    assert "malformed_response" in _kinds(run) and "deterministic_failure" in _kinds(run)


def test_the_correction_does_not_show_the_model_its_own_cut_answer(tmp_path: Path) -> None:
    """Issue 33 #7: SmolLM2 copied the quoted error (its own cut answer) into its next one."""
    mock = MockModel(turns=[{"fault": "malformed", "raw": '{"answer": "a copy of a copy of'},
                            {"text": "5"}], deterministic=True)

    run = _ask(tmp_path, mock)
    assert run.result() == "5"
    told = mock.requests[1]["request"]["messages"][-1]["content"]
    assert "could not be used" in told and "a copy of" not in told and "call 1" not in told
    assert "deterministic_failure" in _kinds(run)


def test_an_answer_cut_at_its_limit_is_kept_and_said(tmp_path: Path) -> None:
    mock = MockModel(turns=[{"text": "It is five, because two and thr…", "finish_reason": "length"}])

    run = _ask(tmp_path, mock)
    assert run.result() == "It is five, because two and thr…"
    (note,) = [n for n in run.notices() if n["kind"] == "answer_cut"]
    assert "length limit (max_output_tokens=256)" in note["message"]
    assert "answer_cut" not in _kinds(_ask(tmp_path / "2", MockModel(turns=[{"text": "5"}])))


def test_a_deterministic_failure_fails_once_when_no_correction_is_left(tmp_path: Path) -> None:
    mock = MockModel(turns=[{"fault": "malformed"}] * 6, deterministic=True)

    run = _ask(tmp_path, mock, corrections=0, retries=2, call_retries=2)
    row = run.status().tasks["adder"]
    assert row.state == "failed" and row.attempts == 1
    assert "DeterministicFailure" in row.error and "not retried" in row.error
    assert len(mock.requests) == 1                     # neither the call nor the task again


def test_a_sampling_models_malformed_answer_is_still_retried(tmp_path: Path) -> None:
    mock = MockModel(turns=[{"fault": "malformed"}, {"text": "5"}])

    @agent_task(model=mock, tools=[add])
    def adder(question: str) -> str:
        return question

    assert adder("2 + 3?") == "5"
    assert mock.requests[1]["request"]["messages"] == mock.requests[0]["request"]["messages"]


def test_a_function_returning_no_prompt_fails_once_with_a_clear_message(tmp_path: Path) -> None:
    mock = MockModel(turns=[{"text": "x"}])

    @agent_task(model=mock, retries=2)
    def broken(question: str) -> str:
        return None                                    # type: ignore[return-value]

    @pipeline
    def flow():
        return broken("hi")

    run = flow.run(store=_store(tmp_path))
    row = run.status().tasks["broken"]
    assert row.state == "failed" and row.attempts == 1
    assert "must return the prompt" in row.error and "returned: None" in row.error
    assert mock.requests == []


def test_a_typed_output_is_checked_corrected_and_returned_typed(tmp_path: Path) -> None:
    mock = MockModel(turns=[{"text": "five"},
                            {"text": '{"total": "5", "explanation": "2+3"}'},
                            {"text": '```json\n{"total": 5, "explanation": "2+3"}\n```'}])

    @agent_task(model=mock, output=Sum)
    def summed(question: str) -> str:
        return question

    @pipeline
    def flow():
        return summed("2 + 3?")

    run = flow.run(store=_store(tmp_path))
    assert run.result() == Sum(total=5, explanation="2+3")
    first = mock.requests[0]["request"]["messages"]
    assert first[0]["role"] == "system" and '"total"' in first[0]["content"]
    told = [m["content"] for m in mock.requests[1]["request"]["messages"] if m["role"] == "user"]
    assert "is not JSON" in told[-1]
    told = [m["content"] for m in mock.requests[2]["request"]["messages"] if m["role"] == "user"]
    assert "Expected `int`, got `str` - at `$.total`" in told[-1]
    assert _kinds(run).count("output_invalid") == 2


def test_a_typed_output_past_the_corrections_fails_the_task(tmp_path: Path) -> None:
    mock = MockModel(turns=[{"text": "five"}] * 3)

    @agent_task(model=mock, output=int, corrections=1, retries=2)
    def number(question: str) -> str:
        return question

    @pipeline
    def flow():
        return number("2 + 3?")

    run = flow.run(store=_store(tmp_path))
    row = run.status().tasks["number"]
    assert row.state == "failed" and row.attempts == 1 and "OutputInvalid" in row.error
    assert len(mock.requests) == 2


def test_output_types_msgspec_can_check() -> None:
    class Point(msgspec.Struct):
        x: int
        y: int

    assert parse_output('{"x": 1, "y": 2}', Point) == Point(1, 2)
    assert parse_output("[1, 2]", list[int]) == [1, 2]
    assert parse_output("some text", str) == "some text"
    with pytest.raises(DefinitionError, match="output="):
        agent_task(model=MockModel(turns=[]), output=object())


def test_agent_tasks_ask_again_in_every_run_unless_cache_is_asked(tmp_path: Path) -> None:
    for cache, calls in ((False, 2), (True, 1)):
        mock = MockModel(turns=[{"text": "a"}, {"text": "b"}])

        @agent_task(model=mock, cache=cache)
        def ask(question: str) -> str:
            return question

        @pipeline
        def flow():
            return ask("same question")

        store = str(tmp_path / f"{cache}.duckdb")
        first, second = flow.run(store=store), flow.run(store=store)
        assert len(mock.requests) == calls
        assert (first.result(), second.result()) == (("a", "b") if not cache else ("a", "a"))


@tool(writes=[Arg("out")])
def save(path: Path, text: str, *, out: str) -> str:
    """Write text to a file in the output folder."""
    path.write_text(text)
    return f"saved {path.name}"


def test_a_path_outside_the_roots_goes_back_to_the_model_which_can_correct_it(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    mock = MockModel(turns=[
        {"tool_calls": [{"name": "save", "arguments": {"path": "../escaped.txt", "text": "x"}}]},
        {"tool_calls": [{"name": "save", "arguments": {"path": "kept.txt", "text": "x"}}]},
        {"text": "saved"}])

    @agent_task(model=mock, tools=[save])
    def writer(question: str, out: str) -> str:
        return question

    @pipeline
    def flow(out: str):
        return writer("write it", out)

    run = flow.run(str(out), store=_store(tmp_path))
    assert run.result() == "saved" and (out / "kept.txt").read_text() == "x"
    assert not (tmp_path / "escaped.txt").exists()
    assert [c["outcome"] for c in run.tool_calls()] == ["refused", "ok"]
    told = [m for m in mock.requests[1]["request"]["messages"] if m["role"] == "tool"]
    assert told[0]["content"].startswith("error: refused:") and "escaped.txt" in \
        told[0]["content"]
