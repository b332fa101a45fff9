"""The ``hashing`` embedder: a fast, deterministic lexical stand-in.

scikit-learn's ``HashingVectorizer`` maps words (lowercased, accents folded,
English stop words dropped) into 384 signed buckets and L2-normalises the
result. No model, no fitting and no state: the same text always gets the
same vector, in any process, at tens of thousands of paragraphs a second.
Cosine similarity then approximates word overlap, which is enough to test a
retrieval pipeline end to end.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ledgerflow import hookimpl

if TYPE_CHECKING:
    import numpy as np

NAME = "hashing"
DIM = 384


class HashingEmbedder:
    """``HashingVectorizer(n_features=384)``, L2-normalised, as an embedder.

    Example:
        >>> emb = HashingEmbedder()
        >>> vectors = emb.embed(["patent grant", "patent license"])
        >>> vectors.shape
        (2, 384)
    """

    name = NAME
    dim = DIM
    #: Bump when the vectorizer settings change (old vectors become incomparable).
    version = "hashing-v1:words,stop=english,alternate_sign,l2,384"

    def __init__(self) -> None:
        self._vectorizer: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        with self._lock:
            if self._vectorizer is None:
                import numpy as np
                from sklearn.feature_extraction.text import HashingVectorizer

                self._vectorizer = HashingVectorizer(
                    n_features=DIM, lowercase=True, strip_accents="unicode",
                    stop_words="english", alternate_sign=True, norm="l2", dtype=np.float32)
            return self._vectorizer

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return a float32 array of shape ``(len(texts), 384)``; empty text -> zeros."""
        matrix = self._get().transform(list(texts))
        return matrix.toarray()


@hookimpl
def ledgerflow_embedder_names() -> list[str]:
    """This plugin provides ``hashing``."""
    return [NAME]


@hookimpl
def ledgerflow_make_embedder(name: str) -> HashingEmbedder | None:
    """Build the hashing embedder (cheap: the vectorizer is created on first use)."""
    return HashingEmbedder() if name == NAME else None
