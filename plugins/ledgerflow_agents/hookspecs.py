"""Hook specifications of the model-provider registry.

A provider plugin is a module (or object) registered in the ``ledgerflow``
entry-point group that implements these hooks::

    from ledgerflow import hookimpl

    @hookimpl
    def ledgerflow_model_names() -> list[str]:
        return ["my-provider"]

    @hookimpl
    def ledgerflow_make_model(name: str, options: dict):
        if name != "my-provider":
            return None                  # not ours: let the next plugin answer
        return MyModel(**options)        # follows ledgerflow_agents.ChatModel

:mod:`ledgerflow_agents` adds these specifications to the plugin manager
through ``ledgerflow_addhooks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .provider import ChatModel

hookspec = pluggy.HookspecMarker("ledgerflow")


@hookspec
def ledgerflow_model_names() -> list[str]:
    """Return the provider names this plugin can build (only those usable here)."""
    raise NotImplementedError


@hookspec(firstresult=True)
def ledgerflow_make_model(name: str, options: dict[str, Any]) -> ChatModel | None:
    """Build the model of provider ``name`` with ``options``, or return None if not yours.

    ``options`` holds ``model`` when the caller wrote ``"provider:model-id"``,
    plus whatever the caller passed. Must be cheap: load weights lazily, on
    the first call. Raise :class:`ledgerflow.errors.ConfigError` for bad
    options and :class:`ledgerflow.errors.PluginError` for a missing
    dependency, each with a hint.
    """
    raise NotImplementedError
