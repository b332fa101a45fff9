"""The request/response types and the provider registry."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest
from click.testing import CliRunner

import ledgerflow_agents as agents
from ledgerflow import hookimpl
from ledgerflow.errors import PluginError
from ledgerflow.plugins import get_plugin_manager
from ledgerflow_agents import (
    ChatModel,
    MockModel,
    ModelNotFoundError,
    ModelRequest,
    ModelResponse,
    Pricing,
    Usage,
    get_model,
    model_names,
)

from .conftest import TOOLS, user


def test_the_package_exports_what_it_lists() -> None:
    assert agents.__all__ == sorted(agents.__all__)
    assert all(hasattr(agents, name) for name in agents.__all__)


def test_a_request_digest_is_the_same_in_another_process() -> None:
    req = ModelRequest([{"role": "system", "content": "be brief"}, user("héllo")],
                       tools=TOOLS, max_output_tokens=32)
    code = ("import json, sys; from ledgerflow_agents import ModelRequest; "
            "print(ModelRequest.from_dict(json.loads(sys.stdin.read())).digest())")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(req.to_dict()),
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == req.digest()
    assert ModelRequest([user("hello")]).digest() != ModelRequest([user("hello!")]).digest()


@pytest.mark.parametrize("kwargs, fragment", [
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [user("x")], "tools": [TOOLS[0], TOOLS[0]]}, "duplicate tool names"),
    ({"messages": [user("x")], "tools": [{"parameters": {}}]}, "non-empty string name"),
    ({"messages": [user("x")], "tools": TOOLS, "tool_choice": "rm"}, "tool_choice 'rm'"),
    ({"messages": [user("x")], "tool_choice": "required"}, "needs at least one tool"),
    ({"messages": [user("x")], "max_output_tokens": 0}, "max_output_tokens"),
    ({"messages": [user("x")], "temperature": -1}, "temperature"),
])
def test_bad_requests_are_refused(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ModelRequest(**kwargs)  # type: ignore[arg-type]


def test_a_response_survives_the_round_trip_through_json() -> None:
    resp = MockModel(turns=[{"tool_calls": [{"name": "search_index",
                                             "arguments": {"query": "ü"}}],
                             "usage": {"input_tokens": 7, "output_tokens": 3}}]
                     ).complete(ModelRequest([user("x")], tools=TOOLS))
    back = ModelResponse.from_dict(json.loads(json.dumps(resp.to_dict())))
    assert back == resp
    assert back.request_digest == resp.request_digest
    assert back.response_digest == resp.response_digest


def test_pricing_prices_tokens() -> None:
    price = Pricing.per_million(input=1.0, output=4.0)
    assert price.cost(1_000_000, 250_000) == pytest.approx(2.0)
    assert Usage(3, 4).total_tokens == 7


def test_the_bundled_providers_are_listed() -> None:
    names = model_names()
    assert {"mock", "openai"} <= set(names)


def test_an_unknown_provider_lists_the_installed_ones() -> None:
    with pytest.raises(ModelNotFoundError) as info:
        get_model("gpt-9000")
    assert "model provider 'gpt-9000' not found; installed: " in str(info.value)
    assert "mock" in str(info.value) and "openai" in str(info.value)
    assert isinstance(info.value, PluginError) and info.value.hint


def test_a_model_object_is_taken_as_it_is_and_junk_is_refused() -> None:
    mock = MockModel(turns=[])
    assert get_model(mock) is mock
    assert isinstance(mock, ChatModel)
    with pytest.raises(PluginError, match=r"does not follow|has no name"):
        get_model(object())  # type: ignore[arg-type]


def test_provider_and_model_id_in_one_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_KEY_ALIAS", "sk-secret")
    m = get_model("openai:gpt-4o-mini", {"key": "TEST_KEY_ALIAS",
                                         "pricing": {"input": 0.15, "output": 0.6}})
    assert (m.provider, m.model, m.key_alias) == ("openai", "gpt-4o-mini", "TEST_KEY_ALIAS")
    assert m.pricing == Pricing.per_million(input=0.15, output=0.6)


class _EchoModel:
    name = provider = "echo"
    model = "echo-1"
    pricing = None
    key_alias = None
    exact_input_tokens = True

    def estimate_input_tokens(self, request: ModelRequest) -> int:
        return len(request.messages)

    def complete(self, request: ModelRequest, *, timeout: float | None = None) -> ModelResponse:
        return ModelResponse(text=request.messages[-1]["content"], provider="echo",
                             model="echo-1")


class _EchoPlugin:
    @hookimpl
    def ledgerflow_model_names(self) -> list[str]:
        return ["echo"]

    @hookimpl
    def ledgerflow_make_model(self, name: str, options: dict[str, object]) -> _EchoModel | None:
        return _EchoModel() if name == "echo" else None


def test_a_third_party_provider_plugs_in_through_the_hooks() -> None:
    pm = get_plugin_manager()
    model_names()  # the hook specs are added
    plugin = _EchoPlugin()
    pm.register(plugin, name="echo-provider")
    try:
        assert "echo" in model_names()
        assert get_model("echo").complete(ModelRequest([user("ping")])).text == "ping"
    finally:
        pm.unregister(plugin)
    assert "echo" not in model_names()


def test_pipeline_plugins_shows_the_providers() -> None:
    from ledgerflow.cli import main

    model_names()
    result = CliRunner().invoke(main, ["plugins"])
    assert result.exit_code == 0, result.output
    assert "model:mock" in result.output and "model:openai" in result.output


def test_an_unpickled_response_request_and_model_are_equal() -> None:
    req = ModelRequest([user("x")], tools=TOOLS)
    assert pickle.loads(pickle.dumps(req)) == req
