"""What a governed call is made under, and what every call shares: budgets, key, limits.

:class:`Governance` bundles the budgets, key alias and limits of a call;
:func:`resolve_model` builds a provider once per process; :func:`check_key`
refuses a key alias that names no set variable; the usage of an answer is
checked again (:func:`checked`), a provider error is scrubbed of known key
values before it becomes the attempt's error (:func:`scrubbed`), and
:func:`observe` reports a call to :mod:`ledgerflow_observability.genai` when
that plugin is installed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ledgerflow.errors import ConfigError

from .budget import Budget
from .errors import ProviderError
from .limits import KeyLimits
from .provider import ChatModel, ModelResponse, Usage
from .redact import redact

__all__ = ["Governance", "check_key", "checked", "cost_of", "observe", "resolve_model",
           "result_text", "scrubbed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Governance:
    """The budgets, key and limits a call is made under.

    Args:
        budget: the task's budget (over all its attempts).
        run_budget: the run's, shared by every task of the run that declares it.
        key: the key alias (environment variable name) the call bills.
        key_budget: the key's, shared by every run of the ledger on this machine.
        limits: the key's rate and concurrency limits.
        record_content: keep prompt and response text in the ledger.
        timeout: seconds per model call (None: the provider's default).
        retries: extra tries of a call after a timeout, a malformed answer
            or a retryable provider error, within the attempt.
        rate_limit_tries: tries of a call that gets 429s.
        max_retry_after: the longest Retry-After waited for; a longer one
            fails the attempt (retryably) instead.
    """

    budget: Budget | None = None
    run_budget: Budget | None = None
    key: str | None = None
    key_budget: Budget | None = None
    limits: KeyLimits | None = None
    record_content: bool = False
    timeout: float | None = None
    retries: int = 2
    rate_limit_tries: int = 5
    max_retry_after: float = 120.0


def _genai() -> Any:
    try:
        from ledgerflow_observability import genai
    except ImportError:         # the observability plugin is not installed
        return None
    return genai


@contextlib.contextmanager
def observe(kind: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
    genai = _genai()
    if genai is None:
        yield None
        return
    with getattr(genai, kind)(*args, **kwargs) as call:
        yield call


def cost_of(model: ChatModel, usage: Usage) -> float:
    return model.pricing.cost(usage.input_tokens, usage.output_tokens) if model.pricing else 0.0


def checked(resp: ModelResponse) -> ModelResponse:
    """``resp`` once its usage is known to be whole non-negative counts.

    Any provider, ours or a plugin's, may answer with a usage object of its
    own: the counts are checked again here, so a negative or absurd one is a
    :class:`MalformedResponse` (billed at the reservation), never a credit.
    """
    usage: Any = resp.usage
    counts: list[Any] = [getattr(usage, "input_tokens", None),
                         getattr(usage, "output_tokens", None)]
    Usage(*counts)
    return resp


def scrubbed(exc: ProviderError, gov: Governance) -> ProviderError:
    """``exc`` with known key values out of its message and hint (it becomes the attempt's
    error in the ledger)."""
    exc.args = tuple(redact(a, [gov.key]) if isinstance(a, str) else a for a in exc.args)
    exc.hint = redact(exc.hint, [gov.key]) if exc.hint else exc.hint
    return exc


def result_text(value: object, limit: int | None = None) -> str:
    """A tool's result as the text the model reads (JSON unless it is a string)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str,
                                                           ensure_ascii=False)
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"… [{len(text) - limit} more characters cut]"
    return text


_models: dict[tuple[str, str], ChatModel] = {}


def resolve_model(model: str | ChatModel, key: str | None = None) -> ChatModel:
    """The model object for ``model`` (a provider name is built once per process)."""
    if not isinstance(model, str):
        from . import get_model
        return get_model(model)
    found = _models.get((model, key or ""))
    if found is None:
        from . import get_model
        options: dict[str, Any] = {}
        if key and model.partition(":")[0] == "openai":
            options["key"] = key
        found = _models[(model, key or "")] = get_model(model, options)
    return found


def check_key(key: str | None) -> None:
    """A key alias must name a set environment variable (its value is never read here)."""
    if key is None:
        return
    if not isinstance(key, str) or not key or not key.replace("_", "").isalnum():
        raise ConfigError(f"key={key!r} is not an environment variable name",
                          hint='pass the name of the variable holding the key, e.g. '
                               'key="OPENAI_API_KEY" (never the key itself)')
    if not os.environ.get(key):
        raise ConfigError(f"key alias {key!r}: the environment variable {key} is not set",
                          hint=f"export {key}=... before running (the key is read from it "
                               "when a call is made and is never stored)")
