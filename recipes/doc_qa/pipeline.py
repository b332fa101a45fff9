"""doc_qa: answer a question over a doc_index index, citing the passages, with a governed agent.

Build an index first (the doc_index recipe), then ask::

    pipeline run recipes/doc_index/pipeline.py -p index=index.duckdb
    pipeline run recipes/doc_qa/pipeline.py -p index=index.duckdb \\
        -p question="What does the Apache License 2.0 say about patents?"
    # exit 3: the agent wants to save its answer; approve it, then resume
    pipeline approvals RUN_ID
    pipeline approve RUN_ID answer --digest DIGEST --resume

One task, ``answer``, is an agent (:func:`ledgerflow_agents.agent_task`) with
three tools: ``search_index`` (allowed), ``read_document`` (read-only, the
corpus root only) and ``save_answer`` (writes inside the answers folder; each
call waits for a person's approval). Its budget is 20,000 tokens and 8 tool
calls; every model and tool call is in the ledger (``pipeline usage RUN_ID``,
``pipeline lineage RUN_ID``), and a resume replays them instead of asking
again.

``model=local`` runs SmolLM2-135M-Instruct offline on the CPU (the
``local-model`` extra); any other provider name works too, e.g.
``-p model=openai:gpt-4o-mini`` with ``OPENAI_API_KEY`` set. ``model=mock``
plays the bundled script (``mock_script.json``, or ``-p script=PATH``): a
canned answer to the demo question, whatever the index holds. Without
``-p model=``, the demo question plays that script and says so loudly on
stderr; any other question is refused (exit 2) rather than answered with the
canned text.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from doc_qa_tools import read_document, save_answer, search_index

from ledgerflow import pipeline
from ledgerflow.errors import ConfigError
from ledgerflow_agents import Budget, MockModel, agent_task, get_model

HERE = Path(__file__).resolve().parent
#: The doc_index recipe's bundled corpus (the default ``corpus``).
CORPUS = str(HERE.parent / "doc_index" / "corpus")
MOCK_SCRIPT = str(HERE / "mock_script.json")

SYSTEM = ("You answer questions about a collection of documents. First search the index. "
          "Then answer in one short sentence from the passage that answers the question, "
          "and end it with that passage's id in square brackets, like [licenses/mit.txt#2].")

#: How a passage id looks in search results: the answer must end citing one of them.
CITE = r"\[([^\]\s]+#\d+)\]"

#: A worked example for the small local model: search, read the result, answer with a citation.
EXAMPLES: list[Any] = [[
    {"role": "user", "content": "Question: What is a heap?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "ex_1", "name": "search_index", "arguments": {"query": "heap"}}]},
    {"role": "tool", "tool_call_id": "ex_1", "name": "search_index",
     "content": "[notes/heaps.md#3] Heaps are arrays for which a[k] <= a[2*k+1] and "
                "a[k] <= a[2*k+2] for all k.\n[notes/sorting.md#0] Sorting puts items in "
                "order."},
    {"role": "assistant", "content": "A heap is an array in which every parent is at most "
                                     "as large as its children [notes/heaps.md#3]."},
]]


def ask(question: str, index: str, corpus: str, answers: str) -> str:
    """The prompt: the question (the tools get index, corpus and answers)."""
    return f"Question: {question}"


_made: dict[tuple[str, bool, str, bool], Any] = {}


def answerer(model: str = "mock", save: bool = True, script: str | None = None,
             record_content: bool = False) -> Any:
    """The ``answer`` agent task for a model name (made once per process)."""
    key = (model, save, script or "", record_content)
    if key not in _made:
        if model == "mock":
            chat: Any = MockModel.from_file(script or MOCK_SCRIPT)
        elif model == "local":
            chat = get_model("local", {"examples": EXAMPLES})
        else:
            chat = get_model(model)
        tools = [search_index, read_document, *([save_answer] if save else [])]
        _made[key] = agent_task(
            model=chat, tools=tools, approve=["save_answer"] if save else [],
            budget=Budget(tokens=20_000, tool_calls=8), max_steps=6, max_output_tokens=160,
            tool_choice="required" if model == "local" else "auto", system=SYSTEM,
            record_content=record_content, cite=CITE, name="answer", cache=False)(ask)
    return _made[key]


#: The question the bundled mock script answers (with a canned text).
DEMO_QUESTION = "What does the Apache License 2.0 say about patents?"

CANNED = ("doc_qa: model=mock is a scripted mock: the answer is CANNED ({script}), not read "
          "from your index or written by a model. For a real answer: -p model=local "
          "(offline, the local-model extra) or -p model=openai:gpt-4o-mini")


def choose_model(question: str, model: str | None, script: str | None) -> str:
    """The model to use: refuse a real question without one, and say when it is the mock.

    Raises:
        ConfigError: a question other than the demo one and no ``model``.
    """
    if model is None:
        if question != DEMO_QUESTION and script is None:
            raise ConfigError(
                "doc_qa needs a model for this question: without -p model= it would play "
                "the scripted mock, which answers every question with the same canned text",
                hint="pass -p model=local (offline SmolLM2, the local-model extra), "
                     "-p model=openai:gpt-4o-mini, or -p model=mock for the canned demo")
        model = "mock"
    if model == "mock":
        print(CANNED.format(script=os.path.basename(script or MOCK_SCRIPT)), file=sys.stderr,
              flush=True)
    return model


@pipeline
def doc_qa(question: str = DEMO_QUESTION,
           index: str = "index.duckdb", corpus: str = CORPUS, answers: str = "answers",
           model: str | None = None, save: bool = True, script: str | None = None,
           record_content: bool = False):
    """Answer ``question`` from the index, citing passages (see the module docstring)."""
    agent = answerer(choose_model(question, model, script), save, script, record_content)
    return agent(question, os.path.abspath(index), os.path.abspath(corpus),
                 os.path.abspath(answers))
