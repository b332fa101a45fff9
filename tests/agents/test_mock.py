"""The scripted mock model: turns, faults, the request log, sharing across processes."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ledgerflow.errors import ConfigError
from ledgerflow_agents import (
    MalformedResponse,
    MockModel,
    ModelRequest,
    ModelTimeout,
    ProviderError,
    RateLimited,
    get_model,
)
from ledgerflow_agents.mock import ENV_SCRIPT

from .conftest import TOOLS, user

ASK = ModelRequest([user("what does the license say?")], tools=TOOLS, max_output_tokens=50)


def test_turns_are_answered_in_order_with_their_usage() -> None:
    mock = MockModel(turns=[
        {"tool_calls": [{"name": "search_index", "arguments": {"query": "license"}}],
         "usage": {"input_tokens": 120, "output_tokens": 18}},
        {"text": "It grants a patent license [LICENSE#2].",
         "usage": {"input_tokens": 200, "output_tokens": 12}},
    ])
    first = mock.complete(ASK)
    assert first.tool_calls == ({"id": "call_0_0", "name": "search_index",
                                 "arguments": {"query": "license"}},)
    assert (first.text, first.finish_reason) == ("", "tool_calls")
    assert (first.usage.input_tokens, first.usage.output_tokens) == (120, 18)
    second = mock.complete(ASK)
    assert (second.text, second.tool_calls, second.finish_reason) == (
        "It grants a patent license [LICENSE#2].", (), "stop")
    assert [r["turn"] for r in mock.requests] == [0, 1]
    assert all(r["digest"] == ASK.digest() for r in mock.requests)


def test_unscripted_usage_is_estimated_from_the_request() -> None:
    mock = MockModel(turns=[{"text": "x" * 40}])
    resp = mock.complete(ASK)
    assert resp.usage.input_tokens == mock.estimate_input_tokens(ASK) > 0
    assert resp.usage.output_tokens == 10


def test_a_tool_that_is_not_allowed_is_returned_for_the_caller_to_refuse() -> None:
    mock = MockModel(turns=[{"tool_calls": [{"name": "delete_everything", "arguments": {}}]}])
    resp = mock.complete(ASK)
    assert resp.tool_calls[0]["name"] == "delete_everything"
    assert resp.tool_calls[0]["name"] not in ASK.tool_names


def test_rate_limit_carries_retry_after() -> None:
    mock = MockModel(turns=[{"fault": "rate_limit", "retry_after": 2.5}, {"text": "ok"}])
    with pytest.raises(RateLimited) as info:
        mock.complete(ASK)
    assert info.value.retry_after == 2.5 and info.value.retryable
    assert mock.complete(ASK).text == "ok"      # the retry gets the next turn


def test_a_timeout_comes_after_its_side_effect(tmp_path: Path) -> None:
    effect = tmp_path / "billed.txt"
    mock = MockModel(turns=[{"fault": "timeout", "usage": {"input_tokens": 5, "output_tokens": 9},
                             "side_effect": {"append": str(effect), "text": "done\n"}}])
    with pytest.raises(ModelTimeout) as info:
        mock.complete(ASK, timeout=30)
    assert effect.read_text() == "done\n"
    assert info.value.retryable and info.value.usage is not None
    assert info.value.usage.output_tokens == 9


def test_a_callable_side_effect_sees_the_request() -> None:
    seen: list[str] = []
    mock = MockModel(turns=[{"fault": "timeout",
                             "side_effect": lambda req: seen.append(req.digest())}])
    with pytest.raises(ModelTimeout):
        mock.complete(ASK)
    assert seen == [ASK.digest()]


def test_malformed_tool_arguments_raise_with_the_raw_answer() -> None:
    mock = MockModel(turns=[{"fault": "malformed"}])
    with pytest.raises(MalformedResponse) as info:
        mock.complete(ASK)
    assert info.value.raw is not None
    with pytest.raises(json.JSONDecodeError):
        json.loads(json.loads(info.value.raw)["arguments"])
    assert info.value.usage is not None     # the malformed answer was still billed


def test_a_late_answer_times_out_a_caller_with_a_deadline() -> None:
    mock = MockModel(turns=[{"fault": "late", "delay": 5, "text": "too late"},
                            {"fault": "late", "delay": 0.05, "text": "slow but fine"}])
    with pytest.raises(ModelTimeout) as info:
        mock.complete(ASK, timeout=0.05)
    assert info.value.late and info.value.usage is not None
    assert mock.complete(ASK).text == "slow but fine"      # no deadline: it answers


def test_an_oversize_response_reports_more_than_was_reserved() -> None:
    mock = MockModel(turns=[{"fault": "oversize", "text": "long"},
                            {"text": "x", "usage": {"input_tokens": 1, "output_tokens": 999}}])
    assert mock.complete(ASK).usage.output_tokens > ASK.max_output_tokens
    assert mock.complete(ASK).usage.output_tokens == 999


def test_a_provider_error_says_whether_to_retry() -> None:
    mock = MockModel(turns=[{"fault": "error", "retryable": False, "message": "bad request"}])
    with pytest.raises(ProviderError, match="bad request") as info:
        mock.complete(ASK)
    assert not info.value.retryable


def test_an_exhausted_script_fails_without_retry() -> None:
    mock = MockModel(turns=[{"text": "only one"}])
    mock.complete(ASK)
    with pytest.raises(ProviderError, match="exhausted") as info:
        mock.complete(ASK)
    assert not info.value.retryable
    assert len(mock.requests) == 2       # the refused call is logged too


@pytest.mark.parametrize("turn, fragment", [
    ({"txt": "typo"}, "unknown keys: txt"),
    ({"fault": "explode"}, "unknown fault 'explode'"),
    ({"tool_calls": [{"arguments": {}}]}, "has no name"),
    ({"tool_calls": [{"name": "t", "arguments": "{"}]}, "not a dict"),
])
def test_bad_scripts_are_refused(turn: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        MockModel(turns=[turn])


def test_conversation_cursor_gives_each_conversation_the_whole_script() -> None:
    mock = MockModel(turns=[{"tool_calls": [{"name": "search_index", "arguments": {}}]},
                            {"text": "answer"}], cursor="conversation")
    results: dict[int, list[str]] = {}

    def agent(i: int) -> None:
        req = ModelRequest([user(f"question {i}")], tools=TOOLS)
        first = mock.complete(req)
        results[i] = [first.tool_calls[0]["name"], mock.complete(req).text]

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: ["search_index", "answer"] for i in range(20)}
    assert len(mock.requests) == 40


def test_a_pickled_mock_with_a_log_shares_the_script_with_a_subprocess(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    mock = MockModel(turns=[{"text": "from the child"}, {"text": "from the parent"}], log=log)
    blob = tmp_path / "mock.pickle"
    blob.write_bytes(pickle.dumps(mock))
    code = ("import pickle, sys; from ledgerflow_agents import ModelRequest; "
            "m = pickle.loads(open(sys.argv[1], 'rb').read()); "
            "print(m.complete(ModelRequest([{'role': 'user', 'content': 'hi'}])).text)")
    out = subprocess.run([sys.executable, "-c", code, str(blob)], capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "from the child"
    assert mock.complete(ModelRequest([user("hi")])).text == "from the parent"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["turn"] for e in entries] == [0, 1]
    assert len({e["pid"] for e in entries}) == 2
    assert len({e["digest"] for e in entries}) == 1    # the same request, asked twice


def test_a_script_file_named_by_the_environment_drives_a_subprocess(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"fault": "rate_limit", "retry_after": 3},
                                            {"text": "second"}],
                                  "log": "requests.jsonl"}))
    code = ("from ledgerflow_agents import ModelRequest, RateLimited, get_model\n"
            "m = get_model('mock')\n"
            "req = ModelRequest([{'role': 'user', 'content': 'hi'}])\n"
            "try:\n    m.complete(req)\nexcept RateLimited as e:\n    print('429', e.retry_after)\n")
    env = {**__import__("os").environ, ENV_SCRIPT: str(script)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, check=True)
    assert out.stdout.split() == ["429", "3.0"]
    mock = MockModel.from_file(script)
    assert mock.complete(ModelRequest([user("hi")])).text == "second"
    assert [r["fault"] for r in mock.requests] == ["rate_limit", None]


def test_the_mock_needs_a_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SCRIPT, raising=False)
    with pytest.raises(ConfigError, match="needs a script"):
        get_model("mock")
    assert get_model("mock", {"turns": [{"text": "hi"}]}).complete(ASK).text == "hi"


def test_step_cursor_answers_by_the_number_of_assistant_messages() -> None:
    script = [{"tool_calls": [{"name": "search_index", "arguments": {"query": "q"}}]},
              {"text": "done"}]
    first = MockModel(turns=script, cursor="step").complete(ASK)
    follow = ModelRequest([*ASK.messages,
                           {"role": "assistant", "content": "",
                            "tool_calls": list(first.tool_calls)},
                           {"role": "tool", "tool_call_id": first.tool_calls[0]["id"],
                            "name": "search_index", "content": "[a#0] x"}], tools=TOOLS)
    fresh = MockModel(turns=script, cursor="step")       # another process, no shared log
    assert fresh.complete(follow).text == "done"
    assert fresh.complete(ASK).tool_calls[0]["name"] == "search_index"
    with pytest.raises(ConfigError, match="'step'"):
        MockModel(turns=script, cursor="sideways")


def test_a_mock_answer_says_it_is_scripted() -> None:
    """Issue 30 #2: a canned answer is marked, never taken for a model's."""
    from ledgerflow_agents import ModelRequest

    resp = MockModel(turns=[{"text": "hello"}]).complete(
        ModelRequest([{"role": "user", "content": "hi"}]))
    assert resp.scripted and resp.response["scripted"] is True
    assert type(resp).from_dict(resp.to_dict()).scripted
