"""Helpers shared by the doc_index recipe tests (also imported by child processes)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ledgerflow import hookimpl

ROOT = Path(__file__).resolve().parents[2]
RECIPE_DIR = ROOT / "recipes" / "doc_index"
CORPUS = RECIPE_DIR / "corpus"
PIPELINE_FILE = RECIPE_DIR / "pipeline.py"
SEARCH_SCRIPT = RECIPE_DIR / "doc_index_search.py"

if str(RECIPE_DIR) not in sys.path:
    sys.path.insert(0, str(RECIPE_DIR))


def load_recipe() -> Any:
    """The recipe's pipeline module, loaded by file path the way the kernel loads it."""
    from ledgerflow.control import load_module

    return load_module(PIPELINE_FILE)


def build_locally(source: str | Path, index: str | Path, *, embedder: str = "hashing",
                  size: int = 800, overlap: int = 100) -> dict[str, Any]:
    """Index ``source`` with plain task calls (no kernel): what the pipeline does."""
    recipe = load_recipe()
    from ledgerflow_embed import get_embedder

    version = get_embedder(embedder).version
    docs = recipe.discover(str(source))
    for doc in docs:
        chunks = recipe.chunk(recipe.clean(recipe.read(doc)), size=size, overlap=overlap)
        vectors = recipe.embed(chunks, embedder=embedder, embedder_version=version)
        recipe.update_index(vectors, index=str(index))
    return recipe.prune(str(index), docs)


def make_table(doc_id: str, texts: list[str], *, doc_hash: str = "h0",
               embedder: str = "hashing") -> Any:
    """An ``embed``-shaped Arrow table for ``texts`` (one chunk per text)."""
    recipe = load_recipe()
    from doc_index_text import text_hash

    chunks = []
    start = 0
    for i, t in enumerate(texts):
        chunks.append({"position": i, "start": start, "end": start + len(t), "text": t,
                       "content_hash": text_hash(t)})
        start += len(t) + 1
    return recipe.embed({"doc_id": doc_id, "doc_hash": doc_hash, "path": f"/docs/{doc_id}",
                         "chunks": chunks}, embedder=embedder)


def rows(index: str | Path, columns: str = "doc_id, position, content_hash") -> list[tuple]:
    """All chunk rows of an index, sorted."""
    import duckdb

    con = duckdb.connect(str(index))
    try:
        return con.execute(f"SELECT {columns} FROM chunks ORDER BY doc_id, position").fetchall()
    finally:
        con.close()


def query(index: str | Path, sql: str, params: list[Any] | None = None) -> list[tuple]:
    """Run one SQL query against the index file."""
    import duckdb

    con = duckdb.connect(str(index))
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


class SlowHashing:
    """The hashing embedder, slowed down, under the name ``slow-hashing`` (crash tests).

    Each ``embed`` call appends a line to ``$DOC_INDEX_TEST_MARKER`` (if set)
    and sleeps ``$DOC_INDEX_TEST_DELAY`` seconds (default 0). Its "model" loads
    lazily on the first call, announced as a real one is
    (:func:`ledgerflow_embed.loading.loading`).
    """

    name = "slow-hashing"
    dim = 384

    def __init__(self) -> None:
        from ledgerflow_embed.hashing import HashingEmbedder

        self._inner = HashingEmbedder()
        self.version = "slow+" + self._inner.version
        self._loaded = False

    def embed(self, texts: list[str]) -> Any:
        import os
        import time

        from ledgerflow_embed.loading import loading

        if not self._loaded:
            with loading(self.name, "a test model"):
                self._loaded = True
        marker = os.environ.get("DOC_INDEX_TEST_MARKER")
        if marker:
            with open(marker, "a") as f:
                f.write(f"{len(texts)}\n")
        time.sleep(float(os.environ.get("DOC_INDEX_TEST_DELAY", "0")))
        return self._inner.embed(texts)


class SlowHashingPlugin:
    """Registers :class:`SlowHashing` with the ledgerflow plugin manager."""

    @hookimpl
    def ledgerflow_embedder_names(self) -> list[str]:
        return ["slow-hashing"]

    @hookimpl
    def ledgerflow_make_embedder(self, name: str) -> SlowHashing | None:
        return SlowHashing() if name == "slow-hashing" else None


def register_slow_hashing() -> Any:
    """Register the ``slow-hashing`` embedder in this process; return the plugin object."""
    from ledgerflow.plugins import get_plugin_manager
    from ledgerflow_embed import embedder_names

    embedder_names()  # the embedder hooks exist from here on
    pm = get_plugin_manager()
    existing = pm.get_plugin("test_slow_hashing")
    if existing is not None:
        return existing
    plugin = SlowHashingPlugin()
    pm.register(plugin, name="test_slow_hashing")
    return plugin
