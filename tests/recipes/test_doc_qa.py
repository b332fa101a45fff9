"""The doc_qa recipe end to end through the CLI on the mock model: a cited answer, the ledger,
an approval before the answer is saved, and tools refused outside the allowlist or the corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from doc_index_testutil import CORPUS, build_locally, rows

from ledgerflow_docindex.search import search

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "doc_qa" / "pipeline.py"

CITED = "licenses/apache-2.0.txt#7"      # what the bundled mock script's answer cites


def _cli(*args: str, ledger: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args, "--store", str(ledger)],
                          capture_output=True, text=True, env=env, timeout=180)


def _json(*args: str, ledger: Path) -> Any:
    res = _cli(*args, "--json", ledger=ledger)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


def _run(tmp_path: Path, index: Path, *params: str) -> tuple[subprocess.CompletedProcess[str],
                                                             str]:
    res = _cli("run", str(RECIPE), "-p", f"index={index}", "-p",
               f"answers={tmp_path / 'answers'}", *params, ledger=tmp_path / "ledger.duckdb")
    run_id = res.stdout.split()[1] if res.stdout.startswith("run ") else ""
    return res, run_id


def _tool_calls(run_id: str, ledger: Path) -> list[tuple[str, str, str]]:
    lineage = _json("lineage", run_id, "--task", "answer", ledger=ledger)
    return [(r["uri"].removeprefix("tool:"), r["attrs"]["outcome"], r["attrs"]["approved_by"])
            for r in lineage if r["direction"] == "tool_call"]


def test_the_answer_cites_a_real_chunk_and_is_saved_once_after_approval(
        tmp_path: Path, corpus_index: Path) -> None:
    ledger = tmp_path / "ledger.duckdb"
    res, run_id = _run(tmp_path, corpus_index)
    assert res.returncode == 3, res.stdout + res.stderr          # waiting for the approval
    assert not (tmp_path / "answers").exists()                   # nothing saved before it
    (req,) = _json("approvals", run_id, ledger=ledger)
    assert req["action"] == "tool:save_answer" and CITED in req["summary"]
    ok = _cli("approve", run_id, "answer", "--digest", req["digest"][:12], "--as", "ana",
              ledger=ledger)
    assert ok.returncode == 0, ok.stderr
    res = _cli("resume", run_id, ledger=ledger)
    assert res.returncode == 0, res.stdout + res.stderr

    saved = (tmp_path / "answers" / "apache-patents.md").read_text()
    assert saved.rstrip().endswith(f"[{CITED}].")
    doc, position = CITED.split("#")
    # the cited chunk is in the index, and the search the agent made returns it
    assert (doc, int(position)) in {(d, p) for d, p, _ in rows(corpus_index)}
    hits = search(corpus_index, "Apache patent license", k=3, snippet_chars=240)
    assert (doc, int(position)) in {(h.doc_id, h.position) for h in hits}
    assert "patent" in hits[0].snippet.lower()

    assert _tool_calls(run_id, ledger) == [
        ("search_index", "ok", ""), ("search_index", "ok", ""), ("save_answer", "ok", "ana")]   # attempt 1, then 2 (the search replayed)
    usage = _json("usage", run_id, ledger=ledger)
    assert usage["totals"]["model_calls"] == 3 and usage["totals"]["replayed"] == 2
    assert usage["totals"]["tokens"] == 420 + 18 + 610 + 64 + 700 + 52
    status = _json("status", run_id, ledger=ledger)
    assert status["state"] == "succeeded"


def test_a_question_without_a_model_is_refused_not_answered_with_the_canned_text(
        tmp_path: Path, corpus_index: Path) -> None:
    """Issue 30 #2: asked about coffee, the default mock would save the Apache answer."""
    res, run_id = _run(tmp_path, corpus_index, "-p", "question=What about coffee?")
    assert res.returncode == 2, res.stdout + res.stderr
    assert run_id == "" and "Traceback" not in res.stderr
    assert "needs a model" in res.stderr and "-p model=local" in res.stderr
    assert not (tmp_path / "answers").exists()


def test_the_mock_says_loudly_that_its_answer_is_canned(tmp_path: Path,
                                                        corpus_index: Path) -> None:
    for params in ([], ["-p", "model=mock", "-p", "question=What about coffee?"]):
        res, run_id = _run(tmp_path / str(len(params)), corpus_index, *params)
        assert res.returncode == 3, res.stdout + res.stderr
        assert "CANNED" in res.stderr and "-p model=local" in res.stderr
        ledger = tmp_path / str(len(params)) / "ledger.duckdb"
        import ledgerflow
        notices = ledgerflow.get_run(run_id, store=str(ledger)).notices()
        assert [n["kind"] for n in notices].count("scripted_model") == 1


@pytest.mark.parametrize("turn, params, kind", [
    # save=false: save_answer is not among the agent's tools
    ({"name": "save_answer", "arguments": {"path": "a.md", "text": "x"}}, ["-p", "save=false"],
     "ToolNotAllowed"),
    ({"name": "drop_index", "arguments": {}}, [], "ToolNotAllowed"),
    ({"name": "read_document", "arguments": {"path": "../../../pyproject.toml"}}, [],
     "PathNotAllowed"),
])
def test_a_tool_outside_the_allowlist_or_the_corpus_is_refused(
        tmp_path: Path, corpus_index: Path, turn: dict[str, Any], params: list[str],
        kind: str) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"cursor": "step", "turns": [
        {"tool_calls": [{"name": "search_index", "arguments": {"query": "patent"}}]},
        # the refusal goes back to the model twice (corrections=2); the third one fails
        {"tool_calls": [turn]}, {"tool_calls": [turn]}, {"tool_calls": [turn]},
        {"text": "never reached"}]}))
    res, run_id = _run(tmp_path, corpus_index, "-p", f"script={script}", *params)
    assert res.returncode == 1, res.stdout + res.stderr
    ledger = tmp_path / "ledger.duckdb"
    (row,) = _json("status", run_id, ledger=ledger)["tasks"]
    assert row["state"] == "failed" and row["attempts"] == 1 and kind in row["error"]
    assert _tool_calls(run_id, ledger) == [("search_index", "ok", "")] + [
        (turn["name"], "refused", "")] * 3
    assert not (tmp_path / "answers").exists()


def _local_available() -> bool:
    try:
        from ledgerflow_agents.local import available
    except ImportError:
        return False
    return available()


@pytest.mark.local_model
@pytest.mark.skipif(not _local_available(), reason="local model not installed; run ./dev setup")
def test_the_local_model_searches_and_cites_a_passage_it_was_shown_the_same_each_run(
        tmp_path: Path, corpus_index: Path) -> None:
    """With save on (issue 33 #7: its answer ran past the 160 output tokens, the cut JSON
    went back to it as an error and it copied the error text into its answer)."""
    import re

    import ledgerflow

    calls = []
    for n in range(2):
        res, run_id = _run(tmp_path / str(n), corpus_index, "-p", "model=local", "-p",
                           "record_content=true")
        # greedy decoding answers this question without calling save_answer
        assert res.returncode == 0, res.stdout + res.stderr
        run = ledgerflow.get_run(run_id, store=str(tmp_path / str(n) / "ledger.duckdb"))
        answer = run.result()
        models = run.model_calls()
        assert "malformed" not in [m["finish_reason"] for m in models]
        kinds = {x["kind"] for x in run.notices()}
        assert not kinds & {"malformed_response", "deterministic_failure"}, run.notices()
        assert "error" not in answer and "answer again" not in answer
        assert models[0]["tool_calls"] == ["search_index"]
        assert [t["tool"] for t in run.tool_calls()] == ["search_index"]
        shown = json.loads(models[-1]["content"])["messages"]
        results = "\n".join(m["content"] for m in shown if m["role"] == "tool")
        cited = re.search(r"\[([^\]\s]+)#(\d+)\]$", answer)
        assert cited, answer
        assert f"[{cited.group(1)}#{cited.group(2)}]" in results     # one it was shown
        assert (cited.group(1), int(cited.group(2))) in {
            (d, p) for d, p, _ in rows(corpus_index)}
        calls.append([(m["request_hash"], m["response_hash"]) for m in models])
    assert calls[0] == calls[1]                                      # greedy: the same calls


@pytest.mark.minilm
def test_doc_qa_runs_on_a_minilm_index(tmp_path: Path) -> None:
    """Issue 30 #1: the README's sequence (a ``minilm`` index, then doc_qa on it). Loading
    the model reads ``/proc/sys/kernel/random/boot_id``, ``/proc/PID/mounts``, code and
    the model cache, and probes the temp folder: the runtime's reads, not the tool's."""
    import shutil

    source = tmp_path / "docs"
    (source / "licenses").mkdir(parents=True)
    shutil.copy(CORPUS / "licenses" / "apache-2.0.txt", source / "licenses")
    index = tmp_path / "index.duckdb"
    build_locally(source, index, embedder="minilm")
    res, run_id = _run(tmp_path, index)
    assert res.returncode == 3, res.stdout + res.stderr           # waits to save, no refusal
    ledger = tmp_path / "ledger.duckdb"
    assert _tool_calls(run_id, ledger) == [("search_index", "ok", "")]
    (req,) = _json("approvals", run_id, ledger=ledger)
    assert CITED in req["summary"]
    doc, position = CITED.split("#")
    assert (doc, int(position)) in {(d, p) for d, p, _ in rows(index)}
    hits = search(index, "Apache patent license", k=3, snippet_chars=240)
    assert (doc, int(position)) in {(h.doc_id, h.position) for h in hits}
