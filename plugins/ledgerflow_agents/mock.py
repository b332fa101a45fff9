"""The ``mock`` provider: a scripted model with the faults real providers have.

``MockModel(turns=[...])`` answers each call with the next scripted turn::

    {"text": "the answer"}                                   # a final answer
    {"tool_calls": [{"name": "search_index", "arguments": {"query": "patents"}}],
     "usage": {"input_tokens": 120, "output_tokens": 18}}    # a tool call
    {"fault": "rate_limit", "retry_after": 2}                # HTTP 429 + Retry-After
    {"fault": "timeout", "side_effect": {"append": "calls.txt", "text": "x\\n"}}
    {"fault": "malformed"}                                   # tool arguments not JSON
    {"fault": "late", "delay": 3}                            # answers after the deadline
    {"fault": "oversize"}                                    # usage above max_output_tokens
    {"fault": "error", "retryable": false}                   # any other provider failure

A tool call naming a tool that is not allowed is simply scripted
(``{"tool_calls": [{"name": "rm"}]}``): the mock returns what it is told, and
the caller's dispatch must refuse it. A turn's ``delay`` (seconds) applies to
any turn; a turn without ``usage`` bills the request's estimate as input and
a quarter of its output's characters as output.

A mock says it is one: every answer's ``response`` holds ``"scripted": true``
(:attr:`ModelResponse.scripted`), and a governed call records a
``scripted_model`` notice once per attempt, so a canned answer is never taken
for a model's.

Every request is logged before it is answered (:attr:`MockModel.requests`), so
a test can assert that no recorded step was asked twice. By default the log
and the position in the script live in memory (a pickled mock carries a
copy). With ``log=PATH`` they live in a JSON-lines file under an exclusive
lock, so a test, its worker processes and a resumed driver share one script
position and one log; ``MockModel.from_file(PATH)`` or ``get_model("mock")``
with ``LEDGERFLOW_MOCK_MODEL=PATH`` reads a script from JSON
(``{"turns": [...], "log": "requests.jsonl"}``; a relative log path is taken
from the script's folder).

``cursor="conversation"`` gives every conversation (the messages up to its
first user message) its own position in the script, so twenty agent tasks
running the same two-turn script concurrently each get turn 0, then turn 1.
``cursor="step"`` answers turn N to a conversation holding N assistant
messages: stateless, so any process (a resumed driver too) answers alike
without a shared log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ledgerflow import hookimpl
from ledgerflow.errors import ConfigError

from ._canonical import canonical_json, digest
from .errors import MalformedResponse, ModelTimeout, ProviderError, RateLimited
from .provider import (
    ModelRequest,
    ModelResponse,
    Pricing,
    ToolCall,
    Usage,
    estimate_tokens_from_bytes,
)

__all__ = ["ENV_SCRIPT", "FAULTS", "MockModel"]

NAME = "mock"
#: Environment variable naming a JSON script for ``get_model("mock")``.
ENV_SCRIPT = "LEDGERFLOW_MOCK_MODEL"
FAULTS = frozenset({"rate_limit", "timeout", "malformed", "late", "oversize", "error"})
_TURN_KEYS = frozenset({"text", "tool_calls", "usage", "fault", "retry_after", "delay",
                        "side_effect", "finish_reason", "retryable", "raw", "message"})
_DEFAULT_LATE = 0.5


def _check_turn(i: int, turn: object) -> dict[str, Any]:
    where = f"mock turn {i}"
    if not isinstance(turn, Mapping):
        raise ConfigError(f"{where} is {turn!r}, not a dict", hint='write {"text": "..."}')
    unknown = sorted(set(turn) - _TURN_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown keys: {', '.join(unknown)}",
                          hint="use " + ", ".join(sorted(_TURN_KEYS)))
    fault = turn.get("fault")
    if fault is not None and fault not in FAULTS:
        raise ConfigError(f"{where}: unknown fault {fault!r}",
                          hint="use one of " + ", ".join(sorted(FAULTS)))
    for call in turn.get("tool_calls") or ():
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise ConfigError(f"{where}: tool call {call!r} has no name",
                              hint='write {"name": "tool", "arguments": {...}}')
        if not isinstance(call.get("arguments", {}), Mapping):
            raise ConfigError(f"{where}: arguments of tool call {call['name']!r} are not a dict",
                              hint='use {"fault": "malformed"} to script unparsable arguments')
    effect = turn.get("side_effect")
    if effect is not None and not callable(effect) and not (
            isinstance(effect, Mapping) and ("write" in effect or "append" in effect)):
        raise ConfigError(f"{where}: side_effect must be a callable or "
                          '{"write"|"append": path, "text": ...}', hint="fix the script")
    return dict(turn)


def _conversation_key(request: ModelRequest) -> str:
    head: list[dict[str, Any]] = []
    for m in request.messages:
        head.append(m)
        if m["role"] == "user":
            break
    return digest(head)[:23]


class MockModel:
    """A scripted :class:`~ledgerflow_agents.ChatModel` for tests.

    Args:
        turns: the script, one dict per call (see the module docstring).
        name: the registry name to report.
        model: the model id to report.
        pricing: declared prices (``None``: unknown).
        key_alias: the key alias to report (never read).
        log: a JSON-lines file shared by every copy of this mock, in any
            process; ``None`` keeps the log in memory.
        cursor: ``"global"`` (one position for all calls),
            ``"conversation"`` (one per conversation) or ``"step"`` (the
            number of assistant messages in the request).
        deterministic: stand for a temperature-0 model: a malformed answer is
            then a ``DeterministicFailure``, not retried as it was.

    Raises:
        ConfigError: a turn has an unknown key or fault.

    Example:
        >>> m = MockModel(turns=[{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]},
        ...                      {"text": "done"}])
        >>> req = ModelRequest([{"role": "user", "content": "add one"}])
        >>> m.complete(req).tool_calls[0]["name"], m.complete(req).text
        ('add', 'done')
        >>> len(m.requests)
        2
    """

    provider = NAME
    exact_input_tokens = False

    def __init__(self, turns: Sequence[Mapping[str, Any]], *, name: str = NAME,
                 model: str = "mock-model", pricing: Pricing | None = None,
                 key_alias: str | None = None, log: str | os.PathLike[str] | None = None,
                 cursor: str = "global", deterministic: bool = False) -> None:
        if cursor not in ("global", "conversation", "step"):
            raise ConfigError(f"mock cursor must be 'global', 'conversation' or 'step', "
                              f"given: {cursor!r}",
                              hint='pass cursor="conversation" for one script per conversation')
        self.turns = [_check_turn(i, t) for i, t in enumerate(turns)]
        self.name = name
        self.model = model
        self.pricing = pricing
        self.key_alias = key_alias
        self.cursor = cursor
        self.is_deterministic = bool(deterministic)
        self.log_path = None if log is None else Path(log)
        self._memory_log: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    # -- construction from files -------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **overrides: Any) -> MockModel:
        """Read a script: a JSON list of turns, or ``{"turns": [...], "log": ..., ...}``."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the mock script {str(path)!r}: {exc}",
                              hint="write a JSON list of turns, or {\"turns\": [...]}") from exc
        if isinstance(data, list):
            data = {"turns": data}
        opts: dict[str, Any] = {k: v for k, v in data.items() if k != "turns"}
        if opts.get("log") is not None and not Path(opts["log"]).is_absolute():
            opts["log"] = str(path.parent / opts["log"])
        if isinstance(opts.get("pricing"), Mapping):
            opts["pricing"] = Pricing.per_million(input=float(opts["pricing"]["input"]),
                                                  output=float(opts["pricing"]["output"]))
        opts.update(overrides)
        return cls(data.get("turns") or [], **opts)

    def __repr__(self) -> str:
        where = f", log={str(self.log_path)!r}" if self.log_path else ""
        return f"MockModel({len(self.turns)} turns, cursor={self.cursor!r}{where})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- the request log ---------------------------------------------------------

    @contextlib.contextmanager
    def _locked_log(self) -> Iterator[list[dict[str, Any]]]:
        """Hold the log exclusively (threads and processes); yield its entries."""
        with self._lock:
            if self.log_path is None:
                yield self._memory_log
                return
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a+", encoding="utf-8") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                try:
                    fh.seek(0)
                    entries = [json.loads(line) for line in fh if line.strip()]
                    before = len(entries)
                    yield entries
                    for entry in entries[before:]:
                        fh.write(json.dumps(entry, sort_keys=True) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request received, oldest first: ``seq``, ``turn``, ``conversation``,
        ``digest``, ``fault``, ``pid``, ``at`` (epoch seconds) and the ``request`` itself."""
        with self._locked_log() as entries:
            return [dict(e) for e in entries]

    def reset(self) -> None:
        """Forget the log and go back to the first turn."""
        with self._lock:
            self._memory_log.clear()
            if self.log_path is not None and self.log_path.exists():
                self.log_path.unlink()

    def _take_turn(self, request: ModelRequest) -> tuple[int, dict[str, Any]]:
        conversation = _conversation_key(request)
        with self._locked_log() as entries:
            if self.cursor == "global":
                index = len(entries)
            elif self.cursor == "step":
                index = sum(1 for m in request.messages if m["role"] == "assistant")
            else:
                index = sum(1 for e in entries if e["conversation"] == conversation)
            turn = self.turns[index] if index < len(self.turns) else None
            entries.append({"seq": len(entries), "turn": index, "conversation": conversation,
                            "digest": request.digest(), "pid": os.getpid(),
                            "at": time.time(),
                            "fault": None if turn is None else turn.get("fault"),
                            "request": request.to_dict()})
        if turn is None:
            raise ProviderError(
                f"mock model script exhausted: call {index + 1} but only {len(self.turns)} turns",
                hint="add turns to the script (or the caller called more often than expected)",
                retryable=False)
        return index, turn

    # -- the model interface -----------------------------------------------------

    def deterministic(self, request: ModelRequest) -> bool:
        """Whether a retry of ``request`` would give the same answer (``deterministic=``:
        the mock then stands for a temperature-0 model, whose failures are not retried)."""
        return self.is_deterministic

    def estimate_input_tokens(self, request: ModelRequest) -> int:
        """A quarter of the request's content and schema bytes, rounded up."""
        return estimate_tokens_from_bytes(request, bytes_per_token=4.0, per_message=0)

    def complete(self, request: ModelRequest, *, timeout: float | None = None) -> ModelResponse:
        """Answer with the next turn of the script, or raise its fault."""
        started = time.monotonic()
        index, turn = self._take_turn(request)
        fault = turn.get("fault")
        calls = [ToolCall(id=str(c.get("id") or f"call_{index}_{i}"), name=str(c["name"]),
                          arguments=dict(c.get("arguments") or {}))
                 for i, c in enumerate(turn.get("tool_calls") or ())]
        text = "" if calls and "text" not in turn else str(turn.get("text") or "")
        usage = self._usage(request, turn, text, calls)
        effect = turn.get("side_effect")
        if effect is not None:
            _run_side_effect(effect, request)
        delay = turn.get("delay")
        if fault == "late" and delay is None:
            delay = (timeout or 0.0) + _DEFAULT_LATE
        if delay:
            if timeout is not None and float(delay) > timeout:
                time.sleep(timeout)
                raise ModelTimeout(f"mock turn {index} answers after {delay}s, "
                                   f"past the {timeout}s timeout", timeout=timeout, late=True,
                                   usage=usage)
            time.sleep(float(delay))
        if fault == "rate_limit":
            retry_after = turn.get("retry_after", 1.0)
            raise RateLimited(f"mock turn {index}: rate limited (429), retry after {retry_after}s",
                              retry_after=None if retry_after is None else float(retry_after))
        if fault == "timeout":
            raise ModelTimeout(f"mock turn {index}: no answer within the timeout",
                               timeout=timeout, usage=usage)
        if fault == "error":
            raise ProviderError(str(turn.get("message") or f"mock turn {index}: provider error"),
                                retryable=bool(turn.get("retryable", True)), usage=usage,
                                status=500)
        if fault == "malformed":
            raw = str(turn.get("raw") or '{"name": "search_index", "arguments": "{\\"query\\": "}')
            raise MalformedResponse(f"mock turn {index}: tool call arguments are not valid JSON",
                                    usage=usage, raw=raw.encode())
        finish = str(turn.get("finish_reason") or ("tool_calls" if calls else "stop"))
        response = {"text": text, "tool_calls": [dict(c) for c in calls],
                    "usage": usage.to_dict(), "finish_reason": finish, "turn": index,
                    "scripted": True}       # a canned answer, and it says so
        return ModelResponse(text=text, tool_calls=tuple(calls), usage=usage,
                             finish_reason=finish, provider=self.provider, model=self.model,
                             request={"provider": self.provider, "model": self.model,
                                      **request.to_dict()},
                             response=response, raw=canonical_json(response),
                             latency_s=time.monotonic() - started)

    def _usage(self, request: ModelRequest, turn: Mapping[str, Any], text: str,
               calls: Sequence[ToolCall]) -> Usage:
        scripted = turn.get("usage") or {}
        out_size = len(text) + sum(len(canonical_json(dict(c))) for c in calls)
        # a scripted count is passed on as the provider's, unchecked: Usage refuses a
        # bad one as a malformed answer (a test of what a real provider may send)
        input_tokens = scripted.get("input_tokens", self.estimate_input_tokens(request))
        output_tokens = scripted.get("output_tokens", max(1, math.ceil(out_size / 4)))
        if turn.get("fault") == "oversize":
            output_tokens = max(output_tokens, 2 * request.max_output_tokens)
        return Usage(input_tokens, output_tokens)


def _run_side_effect(effect: Callable[[ModelRequest], object] | Mapping[str, Any],
                     request: ModelRequest) -> None:
    if callable(effect):
        effect(request)
        return
    mode, path = ("w", effect["write"]) if "write" in effect else ("a", effect["append"])
    with open(path, mode, encoding="utf-8") as fh:
        fh.write(str(effect.get("text", "")))


@hookimpl
def ledgerflow_model_names() -> list[str]:
    """This plugin provides ``mock``."""
    return [NAME]


@hookimpl
def ledgerflow_make_model(name: str, options: dict[str, Any]) -> MockModel | None:
    """Build a mock from ``options`` (``turns`` or ``script``) or ``$LEDGERFLOW_MOCK_MODEL``."""
    if name != NAME:
        return None
    opts = dict(options)
    script = opts.pop("script", None) or (None if "turns" in opts else os.environ.get(ENV_SCRIPT))
    if script:
        return MockModel.from_file(script, **opts)
    if "turns" not in opts:
        raise ConfigError("the mock model needs a script",
                          hint=f"pass MockModel(turns=[...]) as model=, or set {ENV_SCRIPT}=script.json")
    return MockModel(opts.pop("turns"), **opts)
