"""Hook specifications of the embedder registry.

An embedder plugin is a module (or object) registered in the ``ledgerflow``
entry-point group that implements these hooks::

    from ledgerflow import hookimpl

    @hookimpl
    def ledgerflow_embedder_names() -> list[str]:
        return ["my-model"]

    @hookimpl
    def ledgerflow_make_embedder(name: str):
        if name != "my-model":
            return None          # not ours: let the next plugin answer
        return MyEmbedder()      # has name, version, dim and embed(texts)

:mod:`ledgerflow_embed` adds these specifications to the plugin manager
through ``ledgerflow_addhooks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from . import Embedder

hookspec = pluggy.HookspecMarker("ledgerflow")


@hookspec
def ledgerflow_embedder_names() -> list[str]:
    """Return the names of the embedders this plugin can build."""
    raise NotImplementedError


@hookspec(firstresult=True)
def ledgerflow_make_embedder(name: str) -> Embedder | None:
    """Build the embedder called ``name``, or return None if it is not yours.

    Must be cheap: load heavy models lazily, on the first ``embed`` call, inside
    :func:`ledgerflow_embed.loading.loading` so that the wait is announced.
    :func:`ledgerflow_embed.get_embedder` caches the result per process.
    """
    raise NotImplementedError
