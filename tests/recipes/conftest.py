"""Fixtures of the doc_index recipe tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_index_testutil import CORPUS, build_locally, load_recipe, register_slow_hashing


@pytest.fixture(scope="session")
def recipe():
    """The recipe module (recipes/doc_index/pipeline.py)."""
    return load_recipe()


@pytest.fixture(scope="session")
def corpus_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled corpus indexed with the hashing embedder (read-only for tests)."""
    index = tmp_path_factory.mktemp("corpus_index") / "index.duckdb"
    build_locally(CORPUS, index)
    return index


@pytest.fixture()
def small_corpus(tmp_path: Path) -> Path:
    """A folder of four small documents in every text format."""
    src = tmp_path / "docs"
    (src / "sub").mkdir(parents=True)
    (src / "alpha.txt").write_text("Alpha particles are helium nuclei.\n\nThey ionise air.\n")
    (src / "beta.md").write_text("# Beta decay\n\nA *neutron* becomes a [proton](x.html).\n")
    (src / "sub" / "gamma.html").write_text(
        "<html><head><title>Gamma rays</title><style>p{}</style></head>"
        "<body><p>Gamma rays are photons &amp; very energetic.</p></body></html>")
    (src / "sub" / "notes.txt").write_text("Cosmic rays hit the upper atmosphere.")
    (src / "ignored.py").write_text("print('not a document')")
    (src / ".hidden.txt").write_text("hidden")
    return src


@pytest.fixture()
def slow_hashing():
    """The ``slow-hashing`` test embedder, registered for one test only."""
    import ledgerflow_embed
    from ledgerflow.plugins import get_plugin_manager

    plugin = register_slow_hashing()
    yield plugin
    pm = get_plugin_manager()
    if pm.is_registered(plugin):
        pm.unregister(plugin)
    ledgerflow_embed.clear_cache()
