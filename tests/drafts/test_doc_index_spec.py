"""The doc-index request done right, by hand: it validates, the judge finds nothing wrong, it runs.

The benchmark (``tests/perf/bench_drafts.py``) scores the local model's drafts
with :func:`~tests.drafts.doc_index_request.judge`; this spec is what a draft
that does the request looks like, so a judge or catalogue that rejected it, or
a search task that cannot read the recipe's index, fails here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import ledgerflow
from ledgerflow.cli import main

from .doc_index_request import POLICY, RECIPE, SEARCH, judge

pytest.importorskip("ledgerflow_docindex")


def spec(index: str, query: str) -> dict[str, object]:
    """Discover, the per-document fan-out into the index, then a search of it."""
    r, s = str(RECIPE), str(SEARCH)
    return {"name": "doc_index_request", "tasks": {
        "discover": {"task": f"{r}:discover", "args": {"source": "docs/"}},
        "read": {"task": f"{r}:read", "map": "discover"},
        "clean": {"task": f"{r}:clean", "map": "read"},
        "chunk": {"task": f"{r}:chunk", "map": "clean"},
        "embed": {"task": f"{r}:embed", "map": "chunk"},
        "update_index": {"task": f"{r}:update_index", "map": "embed",
                         "args": {"index": index}},
        "search": {"task": f"{s}:search", "args": {"index": index, "query": query},
                   "after": ["update_index"]}}}


def test_the_request_done_right_validates_and_runs(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    corpus = sorted((RECIPE.parent / "corpus" / "markdown").glob("*.md"))[:2]
    for md in corpus:
        shutil.copy(md, docs / md.name)
    word = next(w for w in corpus[0].read_text().split() if w.isalpha() and len(w) > 6)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "POLICY.toml").write_text(POLICY)
    doc = spec("docs.duckdb", word)
    assert judge(doc, "docs/", "docs.duckdb", word) == []
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    runner = CliRunner()
    res = runner.invoke(main, ["validate", "spec.json", "--policy", "POLICY.toml", "--json"])
    assert res.exit_code == 0, res.output
    # search without the after edge races update_index on the index file: a problem
    racy = json.loads(json.dumps(doc))
    del racy["tasks"]["search"]["after"]
    (tmp_path / "racy.json").write_text(json.dumps(racy))
    res = runner.invoke(main, ["validate", "racy.json", "--policy", "POLICY.toml", "--json"])
    assert res.exit_code == 2
    assert [(p["path"], p["code"]) for p in json.loads(res.stdout)["problems"]] == [
        ("tasks.search", "graph.race")]
    assert judge(racy, "docs/", "docs.duckdb", word) == ["search is not after update_index"]
    run = ledgerflow.run("spec.json", store=str(tmp_path / "ledger.duckdb"), executor="inline")
    assert run.state == "succeeded", [(k, t.state, t.error) for k, t in run.status().tasks.items()]
    hits = run.result("search")
    # the word comes from the first document: the best hit is from it
    assert hits and hits[0]["doc_id"] == corpus[0].name, hits[:1]
    assert {h["doc_id"] for h in hits} <= {md.name for md in corpus}
