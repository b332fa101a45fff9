"""The OpenAI-compatible HTTP provider against a fake server on 127.0.0.1."""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ledgerflow.errors import ConfigError
from ledgerflow_agents import (
    MalformedResponse,
    ModelRequest,
    ModelTimeout,
    ProviderError,
    RateLimited,
    get_model,
)
from ledgerflow_agents.openai_compat import OpenAICompatModel, parse_retry_after

from .conftest import TOOLS, user

SECRET = "sk-test-0123456789-never-shown"
ALIAS = "LEDGERFLOW_TEST_OPENAI_KEY"


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class FakeServer:
    url: str
    replies: list[Reply]
    seen: list[dict[str, Any]]


def completion(content: str | None = "hello", tool_calls: list[dict[str, Any]] | None = None,
               usage: dict[str, int] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    doc: dict[str, Any] = {"id": "chatcmpl-1", "model": "fake-model-2026",
                           "choices": [{"index": 0, "message": message,
                                        "finish_reason": "tool_calls" if tool_calls else "stop"}]}
    if usage is not None:
        doc["usage"] = usage
    return doc


@pytest.fixture
def server() -> Iterator[FakeServer]:
    replies: list[Reply] = []
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen.append({"path": self.path, "headers": dict(self.headers),
                         "body": json.loads(self.rfile.read(length))})
            reply = replies.pop(0) if replies else Reply(500, {"error": {"message": "no reply"}})
            if reply.delay:
                time.sleep(reply.delay)
            payload = json.dumps(reply.body).encode()
            try:
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    try:
        yield FakeServer(f"http://127.0.0.1:{httpd.server_address[1]}/v1", replies, seen)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture
def model(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> OpenAICompatModel:
    monkeypatch.setenv(ALIAS, SECRET)
    m = get_model("openai:fake-model", {"base_url": server.url, "key": ALIAS, "timeout": 10})
    assert isinstance(m, OpenAICompatModel)
    return m


def test_a_plain_answer_with_usage(model: OpenAICompatModel, server: FakeServer) -> None:
    server.replies.append(Reply(body=completion("Paris.", usage={"prompt_tokens": 21,
                                                                 "completion_tokens": 3})))
    resp = model.complete(ModelRequest([{"role": "system", "content": "be brief"},
                                        user("capital of France?")], max_output_tokens=16))
    assert (resp.text, resp.tool_calls, resp.finish_reason) == ("Paris.", (), "stop")
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (21, 3)
    assert resp.model == "fake-model-2026" and resp.provider == "openai"
    sent = server.seen[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert sent["body"]["max_tokens"] == 16 and sent["body"]["temperature"] == 0.0
    assert "tools" not in sent["body"]
    assert resp.raw is not None and json.loads(resp.raw)["id"] == "chatcmpl-1"


def test_a_tool_call_sends_only_the_allowed_schemas(model: OpenAICompatModel,
                                                    server: FakeServer) -> None:
    server.replies.append(Reply(body=completion(None, tool_calls=[
        {"id": "call_abc", "type": "function",
         "function": {"name": "search_index", "arguments": '{"query": "patents"}'}}],
        usage={"prompt_tokens": 80, "completion_tokens": 9})))
    req = ModelRequest([user("what about patents?")], tools=TOOLS[:1], max_output_tokens=64)
    resp = model.complete(req)
    assert resp.tool_calls == ({"id": "call_abc", "name": "search_index",
                                "arguments": {"query": "patents"}},)
    assert resp.finish_reason == "tool_calls" and resp.text == ""
    body = server.seen[0]["body"]
    assert [t["function"]["name"] for t in body["tools"]] == ["search_index"]
    assert body["tools"][0]["function"]["parameters"] == TOOLS[0]["parameters"]
    assert "examples" not in json.dumps(body["tools"])
    assert body["tool_choice"] == "auto"


def test_the_conversation_goes_out_in_openai_shape(model: OpenAICompatModel,
                                                   server: FakeServer) -> None:
    server.replies.append(Reply(body=completion("done", usage={"prompt_tokens": 1,
                                                               "completion_tokens": 1})))
    call = {"id": "call_1", "name": "search_index", "arguments": {"query": "x"}}
    model.complete(ModelRequest([user("q"), {"role": "assistant", "content": "",
                                             "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": "call_1",
                                  "name": "search_index", "content": "[a#1] text"}],
                                tools=TOOLS, tool_choice="search_index"))
    body = server.seen[0]["body"]
    assert body["messages"][1]["tool_calls"][0]["function"] == {
        "name": "search_index", "arguments": '{"query": "x"}'}
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "call_1",
                                   "content": "[a#1] text"}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "search_index"}}


def test_429_raises_rate_limited_with_retry_after(model: OpenAICompatModel,
                                                  server: FakeServer) -> None:
    server.replies.append(Reply(429, {"error": {"message": "Rate limit reached"}},
                                headers={"Retry-After": "7"}))
    with pytest.raises(RateLimited) as info:
        model.complete(ModelRequest([user("hi")]))
    assert info.value.retry_after == 7.0 and info.value.retryable
    assert "Rate limit reached" in str(info.value)


def test_a_slow_server_raises_model_timeout(model: OpenAICompatModel,
                                            server: FakeServer) -> None:
    server.replies.append(Reply(body=completion("late"), delay=2.0))
    with pytest.raises(ModelTimeout) as info:
        model.complete(ModelRequest([user("hi")]), timeout=0.2)
    assert info.value.retryable and info.value.timeout == 0.2


def test_tool_arguments_that_are_not_json_are_malformed(model: OpenAICompatModel,
                                                        server: FakeServer) -> None:
    server.replies.append(Reply(body=completion(None, tool_calls=[
        {"id": "c", "type": "function",
         "function": {"name": "search_index", "arguments": '{"query": '}}],
        usage={"prompt_tokens": 5, "completion_tokens": 4})))
    with pytest.raises(MalformedResponse) as info:
        model.complete(ModelRequest([user("hi")], tools=TOOLS))
    assert info.value.usage is not None and info.value.usage.output_tokens == 4
    assert info.value.raw is not None


def test_server_errors_are_retryable_and_bad_requests_are_not(model: OpenAICompatModel,
                                                              server: FakeServer) -> None:
    server.replies += [Reply(503, {"error": {"message": "overloaded"}}),
                       Reply(400, {"error": {"message": "unknown field"}})]
    with pytest.raises(ProviderError, match="503") as first:
        model.complete(ModelRequest([user("hi")]))
    with pytest.raises(ProviderError, match="unknown field") as second:
        model.complete(ModelRequest([user("hi")]))
    assert first.value.retryable and not second.value.retryable


def test_the_key_never_shows(model: OpenAICompatModel, server: FakeServer) -> None:
    server.replies.append(Reply(401, {"error": {"message": f"Incorrect API key: {SECRET}"}}))
    with pytest.raises(ProviderError) as info:
        model.complete(ModelRequest([user("hi")]))
    assert not info.value.retryable
    assert SECRET not in str(info.value) and SECRET not in (info.value.raw or b"").decode()
    assert ALIAS in info.value.hint
    assert SECRET not in repr(model)
    assert SECRET.encode() not in pickle.dumps(model)
    server.replies.append(Reply(body=completion("x", usage={"prompt_tokens": 1,
                                                            "completion_tokens": 1})))
    resp = model.complete(ModelRequest([user("hi")]))
    assert SECRET not in json.dumps(resp.to_dict())


def test_an_unset_key_alias_fails_when_the_model_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALIAS, raising=False)
    with pytest.raises(ConfigError, match=f"API key alias '{ALIAS}' is not set") as info:
        get_model("openai:gpt-4o-mini", {"key": ALIAS})
    assert info.value.hint == f"export {ALIAS}=... before running"


def test_no_model_id_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs a model id"):
        get_model("openai")


def test_missing_usage_is_billed_as_an_estimate(model: OpenAICompatModel,
                                                server: FakeServer) -> None:
    server.replies.append(Reply(body=completion("hi")))
    req = ModelRequest([user("hello there")], max_output_tokens=20)
    resp = model.complete(req)
    assert resp.usage.estimated
    assert resp.usage.input_tokens == model.estimate_input_tokens(req)
    assert resp.usage.output_tokens == 20


def test_an_unreachable_server_is_a_retryable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # closed when the block ends: nothing listens
    m = OpenAICompatModel("m", base_url=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(ProviderError, match=r"cannot reach|connection") as info:
        m.complete(ModelRequest([user("hi")]), timeout=5)
    assert info.value.retryable


def test_retry_after_as_an_http_date() -> None:
    assert parse_retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT"},
                             now=1445412500.0) == pytest.approx(10.0)
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after({}) is None


# -- issue 31 #3: usage is checked, a negative count is never a credit --------------------

@pytest.mark.parametrize("usage", [{"prompt_tokens": -500, "completion_tokens": 3},
                                   {"prompt_tokens": 5, "completion_tokens": -3},
                                   {"prompt_tokens": "lots", "completion_tokens": 3},
                                   {"prompt_tokens": 2.5, "completion_tokens": 3},
                                   {"prompt_tokens": 10 ** 12, "completion_tokens": 3}])
def test_bad_usage_is_malformed_never_a_credit(model: OpenAICompatModel, server: FakeServer,
                                                    usage: dict[str, Any]) -> None:
    server.replies.append(Reply(body=completion("hello", usage=usage)))
    with pytest.raises(MalformedResponse, match="usage"):
        model.complete(ModelRequest([{"role": "user", "content": "hi"}]))


def test_a_usage_that_is_not_an_object_is_malformed(model: OpenAICompatModel,
                                                          server: FakeServer) -> None:
    body = completion("hello")
    body["usage"] = [1, 2]
    server.replies.append(Reply(body=body))
    with pytest.raises(MalformedResponse, match="usage"):
        model.complete(ModelRequest([{"role": "user", "content": "hi"}]))
