"""The model-provider interface: one request in, one response (or a typed error) out.

A provider is any object following :class:`ChatModel`; no base class is
needed. The types here are plain data, JSON-serialisable through their
``to_dict`` methods, so an agent loop can hash a request before it is sent,
record the response in the ledger, and replay it later without calling the
model again (:meth:`ModelResponse.from_dict`).

Messages are dicts in the OpenAI chat shape, which every provider here
translates to its own wire format::

    {"role": "system" | "user", "content": "..."}
    {"role": "assistant", "content": "...", "tool_calls": [{"id", "name", "arguments"}]}
    {"role": "tool", "tool_call_id": "call_0_0", "name": "search_index", "content": "..."}

Tools are JSON schemas: ``{"name", "description", "parameters"}`` where
``parameters`` is a JSON Schema object (``type: object``, ``properties``,
``required``), plus optional ``examples`` (``[{"user": "...", "arguments":
{...}}]``) that a small local model uses as few-shot prompts; the HTTP
provider does not send them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

from ledgerflow.errors import DefinitionError

from ._canonical import canonical_json, digest
from .errors import MalformedResponse

__all__ = [
    "MAX_CALL_TOKENS",
    "ChatModel",
    "ModelRequest",
    "ModelResponse",
    "Pricing",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "estimate_tokens_from_bytes",
]

#: ``auto``: the model may call a tool or answer; ``required``: it must call
#: a tool; ``none``: it must answer; any other string names the one tool it
#: must call.
ToolChoice = str
FinishReason = Literal["stop", "tool_calls", "length", "error"]

#: The most tokens one call may report in either direction: more is a
#: malformed answer, never a bill (no model reads or writes ten million
#: tokens in one call).
MAX_CALL_TOKENS = 10_000_000


def token_count(value: object, what: str) -> int:
    """``value`` as a token count a provider reported, or :class:`MalformedResponse`.

    A count is a whole number from 0 to :data:`MAX_CALL_TOKENS` (``bool``,
    floats, strings and negatives are refused): a provider's answer must never
    be able to credit a budget.
    """
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 0 <= value <= MAX_CALL_TOKENS:
        raise MalformedResponse(
            f"the provider reported {what} = {value!r}, not a whole number from 0 to "
            f"{MAX_CALL_TOKENS:,}", hint="the answer is refused and its call billed at "
            "its reservation; check the provider (or the mock script)")
    return value


class ToolCall(TypedDict):
    """One tool call of a response; ``arguments`` is already parsed."""

    id: str
    name: str
    arguments: dict[str, Any]


class _ToolSpecRequired(TypedDict):
    name: str
    parameters: dict[str, Any]


class ToolSpec(_ToolSpecRequired, total=False):
    """A tool as the model sees it: name, description, JSON schema of its arguments."""

    description: str
    examples: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens spent by one call.

    Raises:
        MalformedResponse: a count that is not a whole number from 0 to
            :data:`MAX_CALL_TOKENS` (a negative one would be a credit).

    Attributes:
        input_tokens: prompt tokens billed.
        output_tokens: generated tokens billed.
        estimated: True when the provider reported no usage and these are our
            estimates.
    """

    input_tokens: int
    output_tokens: int
    estimated: bool = False

    def __post_init__(self) -> None:
        token_count(self.input_tokens, "input_tokens")
        token_count(self.output_tokens, "output_tokens")

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"input_tokens", "output_tokens"}`` (+ ``estimated`` when true)."""
        out: dict[str, Any] = {"input_tokens": self.input_tokens,
                               "output_tokens": self.output_tokens}
        if self.estimated:
            out["estimated"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        """Inverse of :meth:`to_dict` (counts checked as :func:`token_count` does)."""
        return cls(data.get("input_tokens", 0), data.get("output_tokens", 0),
                   bool(data.get("estimated", False)))


@dataclass(frozen=True, slots=True)
class Pricing:
    """Declared prices in US dollars per token (``None`` on a model: unknown).

    Raises:
        DefinitionError: a negative, infinite or non-numeric price.

    Example:
        >>> p = Pricing.per_million(input=0.15, output=0.60)
        >>> round(p.cost(1000, 500), 6)
        0.00045
    """

    input_usd_per_token: float
    output_usd_per_token: float

    def __post_init__(self) -> None:
        for name in ("input_usd_per_token", "output_usd_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value < 0:
                raise DefinitionError(f"pricing {name} must be a number >= 0, given: "
                                      f"{value!r}", hint="e.g. Pricing.per_million("
                                      "input=0.15, output=0.60)")

    @classmethod
    def per_million(cls, *, input: float, output: float) -> Pricing:
        """Build from prices per million tokens, the way providers publish them."""
        return cls(input / 1_000_000, output / 1_000_000)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """Return the cost in dollars of that many tokens."""
        return input_tokens * self.input_usd_per_token + output_tokens * self.output_usd_per_token


def _message(m: Mapping[str, Any]) -> dict[str, Any]:
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise ValueError(f"message role must be system, user, assistant or tool, given: {role!r}")
    out: dict[str, Any] = {"role": role, "content": str(m.get("content") or "")}
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = [{"id": str(c["id"]), "name": str(c["name"]),
                              "arguments": dict(c.get("arguments") or {})}
                             for c in m["tool_calls"]]
    if role == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id") or "")
        out["name"] = str(m.get("name") or "")
    return out


def _tool(t: Mapping[str, Any]) -> ToolSpec:
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool needs a non-empty string name, given: {name!r}")
    params = t.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, Mapping) or params.get("type", "object") != "object":
        raise ValueError(f"tool {name!r}: parameters must be a JSON schema of type object")
    spec: ToolSpec = {"name": name, "parameters": dict(params)}
    if t.get("description"):
        spec["description"] = str(t["description"])
    if t.get("examples"):
        spec["examples"] = [dict(e) for e in t["examples"]]
    return spec


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """What the caller asks for; the same request always has the same :meth:`digest`.

    Args:
        messages: the conversation, oldest first (see the module docstring).
        tools: the allowed tools' schemas; only these are shown to the model.
        max_output_tokens: the most tokens the model may generate.
        temperature: 0 is greedy (deterministic where the provider allows it).
        tool_choice: ``auto``, ``required``, ``none``, or one tool's name.
        cite_from: ids the final answer must cite one of (e.g. the passage
            ids the tools returned); providers that constrain decoding
            (``local``) make the answer end with ``[ID]``, others ignore it.
            Part of the digest only when given.

    Raises:
        ValueError: a bad role, a tool without a name, duplicate tool names,
            a ``tool_choice`` naming no allowed tool, or a non-positive
            ``max_output_tokens``.

    Example:
        >>> req = ModelRequest(messages=[{"role": "user", "content": "hi"}], max_output_tokens=16)
        >>> req.digest().startswith("sha256:")
        True
    """

    messages: tuple[dict[str, Any], ...]
    tools: tuple[ToolSpec, ...] = ()
    max_output_tokens: int = 256
    temperature: float = 0.0
    tool_choice: ToolChoice = "auto"
    cite_from: tuple[str, ...] = ()

    def __init__(self, messages: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]] = (), max_output_tokens: int = 256,
                 temperature: float = 0.0, tool_choice: ToolChoice = "auto",
                 cite_from: Sequence[str] = ()) -> None:
        msgs = tuple(_message(m) for m in messages)
        specs = tuple(_tool(t) for t in tools)
        names = [t["name"] for t in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate tool names: {', '.join(dupes)}")
        if tool_choice not in ("auto", "required", "none") and tool_choice not in names:
            raise ValueError(f"tool_choice {tool_choice!r} is not auto, required, none "
                             f"or an allowed tool ({', '.join(names) or 'none allowed'})")
        if tool_choice == "required" and not specs:
            raise ValueError("tool_choice 'required' needs at least one tool")
        if not isinstance(max_output_tokens, int) or max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be a positive int, given: {max_output_tokens!r}")
        if not 0.0 <= float(temperature) <= 2.0:
            raise ValueError(f"temperature must be between 0 and 2, given: {temperature!r}")
        object.__setattr__(self, "messages", msgs)
        object.__setattr__(self, "tools", specs)
        object.__setattr__(self, "max_output_tokens", max_output_tokens)
        object.__setattr__(self, "temperature", float(temperature))
        object.__setattr__(self, "tool_choice", tool_choice)
        object.__setattr__(self, "cite_from", tuple(str(c) for c in cite_from))

    @property
    def tool_names(self) -> list[str]:
        """Names of the allowed tools, in order."""
        return [t["name"] for t in self.tools]

    def to_dict(self) -> dict[str, Any]:
        """The canonical form of the request (JSON-serialisable, no secrets)."""
        return {"messages": [dict(m) for m in self.messages],
                "tools": [dict(t) for t in self.tools],
                "max_output_tokens": self.max_output_tokens,
                "temperature": self.temperature,
                "tool_choice": self.tool_choice,
                **({"cite_from": list(self.cite_from)} if self.cite_from else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelRequest:
        """Inverse of :meth:`to_dict`."""
        return cls(messages=data["messages"], tools=data.get("tools", ()),
                   max_output_tokens=int(data.get("max_output_tokens", 256)),
                   temperature=float(data.get("temperature", 0.0)),
                   tool_choice=str(data.get("tool_choice", "auto")),
                   cite_from=data.get("cite_from") or ())

    def canonical_bytes(self) -> bytes:
        """Compact sorted-key JSON of :meth:`to_dict`."""
        return canonical_json(self.to_dict())

    def digest(self) -> str:
        """``sha256:<hex>`` of :meth:`canonical_bytes`."""
        return digest(self.to_dict())


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """One model answer.

    Attributes:
        text: the final-answer text ('' when the model called tools).
        tool_calls: the calls, arguments parsed; not checked against the
            allowlist (the caller does that at dispatch).
        usage: tokens billed.
        finish_reason: ``stop``, ``tool_calls`` or ``length``.
        provider, model: who answered.
        request: the provider's wire request as a canonical dict (no secrets).
        response: the provider's answer as a canonical dict.
        raw: the raw response bytes, when the provider has them (HTTP).
        latency_s: seconds from sending to the parsed answer.
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=lambda: Usage(0, 0))
    finish_reason: str = "stop"
    provider: str = ""
    model: str = ""
    request: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] = field(default_factory=dict)
    raw: bytes | None = None
    latency_s: float = 0.0

    @property
    def scripted(self) -> bool:
        """True for a canned answer (the ``mock`` provider's): no model wrote it."""
        return bool(self.response.get("scripted"))

    @property
    def request_digest(self) -> str:
        """Digest of the provider's wire request."""
        return digest(self.request)

    @property
    def response_digest(self) -> str:
        """Digest of the raw bytes when present, else of the canonical response."""
        if self.raw is not None:
            import hashlib

            return "sha256:" + hashlib.sha256(self.raw).hexdigest()
        return digest(self.response)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable record of the response (raw bytes as latin-1 text)."""
        return {"text": self.text, "tool_calls": [dict(c) for c in self.tool_calls],
                "usage": self.usage.to_dict(), "finish_reason": self.finish_reason,
                "provider": self.provider, "model": self.model, "request": self.request,
                "response": self.response,
                "raw": None if self.raw is None else self.raw.decode("latin-1"),
                "latency_s": self.latency_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelResponse:
        """Rebuild a recorded response (for replay): inverse of :meth:`to_dict`."""
        raw = data.get("raw")
        calls = tuple(ToolCall(id=str(c["id"]), name=str(c["name"]),
                               arguments=dict(c.get("arguments") or {}))
                      for c in data.get("tool_calls") or ())
        return cls(text=str(data.get("text") or ""), tool_calls=calls,
                   usage=Usage.from_dict(data.get("usage") or {}),
                   finish_reason=str(data.get("finish_reason") or "stop"),
                   provider=str(data.get("provider") or ""), model=str(data.get("model") or ""),
                   request=dict(data.get("request") or {}),
                   response=dict(data.get("response") or {}),
                   raw=None if raw is None else str(raw).encode("latin-1"),
                   latency_s=float(data.get("latency_s") or 0.0))


@runtime_checkable
class ChatModel(Protocol):
    """A chat model with tool calling; what ``model=`` resolves to.

    Attributes:
        name: the registry name it was built under (``"mock"``, ``"local"``).
        provider: the provider family (``"mock"``, ``"local"``, ``"openai"``).
        model: the model id (``"gpt-4o-mini"``, ``"SmolLM2-135M-Instruct-Q4_1"``).
        pricing: declared prices, or ``None`` when unknown.
        key_alias: the environment variable holding its API key, or ``None``.
        exact_input_tokens: True when :meth:`estimate_input_tokens` counts
            with the model's own tokenizer (it is then the billed number).
    """

    name: str
    provider: str
    model: str
    pricing: Pricing | None
    key_alias: str | None
    exact_input_tokens: bool

    def estimate_input_tokens(self, request: ModelRequest) -> int:
        """Return the input tokens ``request`` will cost, before sending it."""
        ...

    def complete(self, request: ModelRequest, *, timeout: float | None = None) -> ModelResponse:
        """Send ``request`` and return the answer.

        Raises:
            RateLimited: wait ``retry_after`` seconds, then retry.
            ModelTimeout: no answer within ``timeout`` seconds.
            MalformedResponse: the answer cannot be parsed.
            ProviderError: anything else; see its ``retryable``.
        """
        ...


def estimate_tokens_from_bytes(request: ModelRequest, *, bytes_per_token: float = 3.0,
                               per_message: int = 4) -> int:
    """A tokenizer-free estimate: UTF-8 bytes of contents and schemas / ``bytes_per_token``.

    English BPE vocabularies average about 4 bytes a token, so the default 3
    over-estimates typical text by a third (a reservation should err high);
    ``per_message`` covers the role markers of chat templates.
    """
    size = 0
    for m in request.messages:
        size += len(m["content"].encode())
        for call in m.get("tool_calls") or ():
            size += len(call["name"]) + len(canonical_json(call["arguments"]))
    for t in request.tools:
        size += len(canonical_json({k: v for k, v in t.items() if k != "examples"}))
    return math.ceil(size / bytes_per_token) + per_message * len(request.messages) + 3
