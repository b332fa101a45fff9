"""The real local model drafts the doc-index request over the recipe's tasks.

Marked ``local_model`` (skipped with the reason when the weights or the
runtime are missing). The constrained decoding makes every draft fit the
drafting schema, so the draft validates; whether it also *does* what was
asked is measured by ``tests/perf/bench_drafts.py`` (see docs/drafts.md:
SmolLM2-135M does not).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner

from ledgerflow.cli import main
from ledgerflow.specs import drafts
from ledgerflow_agents.local import available, missing_packages

from .doc_index_request import POLICY, RECIPE, REQUEST, SEARCH

pytestmark = [
    pytest.mark.local_model,
    pytest.mark.skipif(not available(),
                       reason=f"local model not installed (missing: "
                              f"{', '.join(missing_packages())}); run ./dev setup"),
]


def test_the_local_model_drafts_a_spec_that_validates(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for md in sorted((RECIPE.parent / "corpus" / "markdown").glob("*.md"))[:2]:
        shutil.copy(md, docs / md.name)
    (tmp_path / "POLICY.toml").write_text(POLICY)
    monkeypatch.chdir(tmp_path)
    request = REQUEST.format(dir="docs/", index="docs.duckdb", query="patent grant")
    runner = CliRunner()
    res = runner.invoke(main, ["draft", request, "--tasks", str(RECIPE), "--tasks", str(SEARCH),
                               "--model", "local", "--policy", "POLICY.toml", "--repairs", "1",
                               "-o", "draft.toml", "--store", "ledger.duckdb", "--json"],
                        catch_exceptions=False)
    assert res.exit_code in (0, 2), res.output
    result = json.loads(res.stdout)
    text = (tmp_path / "draft.toml").read_text()
    header = drafts.parse_header(text, None)
    assert header is not None and header.model == "local"
    res = runner.invoke(main, ["validate", "draft.toml", "--policy", "POLICY.toml", "--json"])
    report = json.loads(res.stdout)
    assert res.exit_code == 0, (text, report["problems"])
    assert report["valid"] and result["valid"]
    # every step runs a task of the catalogue, and the model calls are in the ledger
    refs = {step["task"].rpartition(":")[0] for step in tomllib.loads(text)["tasks"].values()}
    assert refs <= {str(RECIPE), str(SEARCH)}
    res = runner.invoke(main, ["usage", header.run, "--store", "ledger.duckdb", "--json"])
    usage = json.loads(res.stdout)
    assert usage["totals"]["model_calls"] == len(result["rounds"]) >= 1
    assert usage["by_model"][0]["model"].startswith("local/")
