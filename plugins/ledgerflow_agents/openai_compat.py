"""The ``openai`` provider: any OpenAI-compatible chat-completions server, over HTTP.

Speaks ``POST {base_url}/chat/completions`` with ``tools`` (function tools),
``tool_choice``, ``max_tokens`` and ``temperature`` using only the standard
library (``urllib``). Works with OpenAI itself and with servers that copy its
API (vLLM, llama.cpp's server, Ollama, LiteLLM's proxy...).

The API key is referenced, never held: ``key="OPENAI_API_KEY"`` names the
environment variable, which is read on each call. The key never appears in
the object, its ``repr``, a pickle, a request digest, a log line or an error
message (a server that echoes it back is redacted).

Options of ``get_model("openai:MODEL", {...})``: ``base_url`` (default
``https://api.openai.com/v1``), ``key`` (the alias; ``None`` for servers
without keys), ``timeout`` (seconds, default 60), ``pricing``
(``{"input": usd_per_million, "output": usd_per_million}``),
``bytes_per_token`` (the estimate's divisor, default 3), ``max_tokens_field``
(``max_tokens`` or ``max_completion_tokens``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any, NoReturn

from ledgerflow import hookimpl
from ledgerflow.errors import ConfigError

from .errors import MalformedResponse, ModelTimeout, ProviderError, RateLimited
from .provider import (
    ModelRequest,
    ModelResponse,
    Pricing,
    ToolCall,
    Usage,
    estimate_tokens_from_bytes,
    token_count,
)

__all__ = ["OpenAICompatModel", "parse_retry_after"]

NAME = "openai"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RETRYABLE_STATUS = frozenset({408, 409, 425, 500, 502, 503, 504, 529})


def parse_retry_after(headers: Mapping[str, str] | Any, now: float | None = None) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or HTTP date) or ``retry-after-ms``.

    Example:
        >>> parse_retry_after({"Retry-After": "7"})
        7.0
    """
    import email.utils

    ms = headers.get("retry-after-ms") or headers.get("Retry-After-Ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("Retry-After") or headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _wire_messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in request.messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": m["content"] or None,
                        "tool_calls": [{"id": c["id"], "type": "function",
                                        "function": {"name": c["name"],
                                                     "arguments": json.dumps(c["arguments"],
                                                                             sort_keys=True)}}
                                       for c in m["tool_calls"]]})
        elif m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"],
                        "content": m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


class OpenAICompatModel:
    """A chat model behind an OpenAI-compatible HTTP API.

    Args:
        model: the model id the server knows (``"gpt-4o-mini"``).
        base_url: the API root, up to ``/v1``.
        key: the environment variable holding the API key (``None``: no key).
        timeout: default seconds per call (a call's ``timeout=`` wins).
        pricing: declared prices, or ``None`` when unknown.
        name: the registry name to report.
        bytes_per_token: the divisor of the tokenizer-free input estimate.
        max_tokens_field: the request field for the output limit.

    Raises:
        ConfigError: no model id, or ``key`` names an unset variable.

    Example:
        >>> import os; os.environ["DEMO_KEY"] = "sk-demo"
        >>> m = OpenAICompatModel("gpt-4o-mini", key="DEMO_KEY")
        >>> "sk-demo" in repr(m)
        False
    """

    provider = NAME
    exact_input_tokens = False

    def __init__(self, model: str, *, base_url: str = DEFAULT_BASE_URL, key: str | None = None,
                 timeout: float = 60.0, pricing: Pricing | None = None, name: str = NAME,
                 bytes_per_token: float = 3.0, max_tokens_field: str = "max_tokens") -> None:
        if not model:
            raise ConfigError("the openai provider needs a model id",
                              hint='write model="openai:gpt-4o-mini" (or options={"model": ...})')
        self.name = name
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.key_alias = key
        self.timeout = float(timeout)
        self.pricing = pricing
        self.bytes_per_token = float(bytes_per_token)
        self.max_tokens_field = max_tokens_field
        self._secret()  # an unset alias fails here, at definition time, not mid-run

    def __repr__(self) -> str:
        return (f"OpenAICompatModel(model={self.model!r}, base_url={self.base_url!r}, "
                f"key={self.key_alias!r})")

    def _secret(self) -> str | None:
        if self.key_alias is None:
            return None
        value = os.environ.get(self.key_alias)
        if not value:
            raise ConfigError(f"API key alias {self.key_alias!r} is not set in the environment",
                              hint=f"export {self.key_alias}=... before running")
        return value

    def estimate_input_tokens(self, request: ModelRequest) -> int:
        """UTF-8 bytes of messages and tool schemas / ``bytes_per_token`` (no tokenizer)."""
        return estimate_tokens_from_bytes(request, bytes_per_token=self.bytes_per_token)

    def wire_request(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (no key: that goes in a header)."""
        body: dict[str, Any] = {"model": self.model, "messages": _wire_messages(request),
                                self.max_tokens_field: request.max_output_tokens,
                                "temperature": request.temperature}
        if request.tools:
            body["tools"] = [{"type": "function",
                              "function": {"name": t["name"],
                                           "description": t.get("description", ""),
                                           "parameters": t["parameters"]}}
                             for t in request.tools]
            choice = request.tool_choice
            body["tool_choice"] = (choice if choice in ("auto", "required", "none")
                                   else {"type": "function", "function": {"name": choice}})
        return body

    def complete(self, request: ModelRequest, *, timeout: float | None = None) -> ModelResponse:
        """POST the request; parse the answer; map HTTP failures to typed errors."""
        import http.client  # here, not at module level: plugin loading stays cheap
        import urllib.error
        import urllib.request
        secret = self._secret()
        body = self.wire_request(request)
        data = json.dumps(body, sort_keys=True).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if secret:
            headers["Authorization"] = f"Bearer {secret}"
        post = urllib.request.Request(f"{self.base_url}/chat/completions", data=data,
                                      headers=headers, method="POST")
        limit = self.timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            with urllib.request.urlopen(post, timeout=limit) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            self._raise_http(exc, secret)
        except TimeoutError as exc:
            raise ModelTimeout(f"{self.base_url} gave no answer within {limit}s",
                               timeout=limit) from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise ModelTimeout(f"{self.base_url} gave no answer within {limit}s",
                                   timeout=limit) from exc
            raise ProviderError(f"cannot reach {self.base_url}: {exc.reason}",
                                hint="check base_url and that the server is up",
                                retryable=True) from exc
        except (ConnectionError, OSError, http.client.HTTPException) as exc:
            raise ProviderError(f"connection to {self.base_url} failed: {exc}",
                                hint="retry; check the server", retryable=True) from exc
        latency = time.monotonic() - started
        return self._parse(request, body, raw, latency)

    def _raise_http(self, exc: Any, secret: str | None) -> NoReturn:
        try:
            raw = exc.read()
        except OSError:
            raw = b""
        detail = raw.decode("utf-8", "replace")
        try:
            detail = str(json.loads(detail)["error"]["message"])
        except (ValueError, KeyError, TypeError):
            pass
        detail = " ".join(detail.split())[:300]
        if secret:
            detail = detail.replace(secret, "***")
            raw = raw.replace(secret.encode(), b"***")
        status = exc.code
        where = f"{self.base_url} answered {status}"
        if status == 429:
            retry_after = parse_retry_after(exc.headers)
            raise RateLimited(f"{where} (rate limited): {detail}", retry_after=retry_after,
                              raw=raw) from None
        if status in (401, 403):
            raise ProviderError(f"{where} (key refused): {detail}", raw=raw, status=status,
                                retryable=False,
                                hint=f"check the key in ${self.key_alias}" if self.key_alias
                                else "this server needs a key: pass key=ALIAS") from None
        raise ProviderError(f"{where}: {detail}", raw=raw, status=status,
                            retryable=status in _RETRYABLE_STATUS or status >= 500,
                            hint="retry later" if status >= 500 else
                            "check the model id and the request") from None

    def _parse(self, request: ModelRequest, body: dict[str, Any], raw: bytes,
               latency: float) -> ModelResponse:
        try:
            doc = json.loads(raw)
            choice = doc["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise MalformedResponse(f"{self.base_url} sent an answer without choices[0].message",
                                    raw=raw) from exc
        usage_doc = doc.get("usage") or {}
        if not isinstance(usage_doc, dict):
            raise MalformedResponse(f"{self.base_url} sent a usage that is not an object: "
                                    f"{str(usage_doc)[:120]!r}", raw=raw)
        if "prompt_tokens" in usage_doc:     # checked: a negative count is never a credit
            usage = Usage(_count(usage_doc, "prompt_tokens"),
                          _count(usage_doc, "completion_tokens"))
        else:  # some servers omit usage: bill our estimate, marked as such
            usage = Usage(self.estimate_input_tokens(request), request.max_output_tokens,
                          estimated=True)
        calls: list[ToolCall] = []
        for i, call in enumerate(message.get("tool_calls") or ()):
            fn = call.get("function") or {}
            args_text = fn.get("arguments") or "{}"
            try:
                args = json.loads(args_text) if isinstance(args_text, str) else args_text
            except ValueError:
                args = None
            if not isinstance(args, dict) or not isinstance(fn.get("name"), str):
                raise MalformedResponse(
                    f"tool call {fn.get('name')!r} has arguments that are not a JSON object: "
                    f"{str(args_text)[:120]!r}", usage=usage, raw=raw)
            calls.append(ToolCall(id=str(call.get("id") or f"call_{i}"), name=fn["name"],
                                  arguments=args))
        finish = str(choice.get("finish_reason") or ("tool_calls" if calls else "stop"))
        return ModelResponse(text=str(message.get("content") or ""), tool_calls=tuple(calls),
                             usage=usage, finish_reason=finish, provider=self.provider,
                             model=str(doc.get("model") or self.model), request=body,
                             response=doc, raw=raw, latency_s=latency)


def _count(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return token_count(0 if value is None else value, f"usage.{name}")


@hookimpl
def ledgerflow_model_names() -> list[str]:
    """This plugin provides ``openai`` (needs a reachable server to be useful)."""
    return [NAME]


@hookimpl
def ledgerflow_make_model(name: str, options: dict[str, Any]) -> OpenAICompatModel | None:
    """Build the HTTP model from ``options`` (``model``, ``base_url``, ``key``, ...)."""
    if name != NAME:
        return None
    opts = dict(options)
    pricing = opts.pop("pricing", None)
    if isinstance(pricing, Mapping):
        pricing = Pricing.per_million(input=float(pricing["input"]),
                                      output=float(pricing["output"]))
    try:
        return OpenAICompatModel(opts.pop("model", ""), pricing=pricing, **opts)
    except TypeError as exc:
        raise ConfigError(f"bad options for the openai provider: {exc}",
                          hint="use model, base_url, key, timeout, pricing, bytes_per_token, "
                               "max_tokens_field") from None
