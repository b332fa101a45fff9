"""The doc_qa agent's tools: search the doc_index index, read a document, save an answer.

Each is a plain typed function with declared permissions:

* ``search_index(query)`` reads the index file (``Arg("index")``; it also
  takes the index's lock file, ``INDEX.lock``) with ``ledgerflow_docindex``'s
  ``search`` (hybrid: BM25 + vectors), as ``pipeline search`` does; each hit is one line
  ``[DOC#POSITION] text``, the bracket being the citation;
* ``read_document(path)`` reads one document, inside the corpus root only;
* ``save_answer(path, text)`` writes a file inside the answers folder only
  (the pipeline asks a person to approve each call).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import msgspec

from ledgerflow_agents import Arg, tool
from ledgerflow_docindex.search import search

#: Longest document text handed to the model (a small model has a small context).
READ_LIMIT = 2000
#: The longest file name and answer save_answer takes: a call to it fits the answer's
#: 160 output tokens (the local model's grammar holds it to these, so it cannot ramble
#: past the budget and leave its JSON cut).
SAVE_PATH_CHARS = 60
SAVE_TEXT_CHARS = 300


@tool(reads=[Arg("index")], writes=[Arg("index", suffix=".lock")], examples=[
    {"user": "Question: which license covers the heapq module?",
     "arguments": {"query": "heapq license"}}])
def search_index(query: Annotated[str, msgspec.Meta(max_length=60)], *, index: str,
                 k: int = 3) -> str:
    """Search the document index; returns passages, each after the id to cite.

    Args:
        query: a few words to search for.
    """
    hits = search(index, query, k=k, snippet_chars=240)
    if not hits:
        return "no passages found"
    return "\n".join(f"[{h.doc_id}#{h.position}] {' '.join(h.snippet.split())}" for h in hits)


@tool(reads=[Arg("corpus")])
def read_document(path: Path, *, corpus: str) -> str:
    """Read one document of the corpus (its path as in a passage id, before the #).

    Args:
        path: the document's path inside the corpus, e.g. licenses/apache-2.0.txt.
    """
    text = path.read_text(errors="replace")
    return text if len(text) <= READ_LIMIT else text[:READ_LIMIT] + " …"


@tool(writes=[Arg("answers")], examples=[
    {"user": "Save the answer 'It is MIT licensed [licenses/mit.txt#0].' to mit.md",
     "arguments": {"path": "mit.md", "text": "It is MIT licensed [licenses/mit.txt#0]."}}])
def save_answer(path: Annotated[Path, msgspec.Meta(max_length=SAVE_PATH_CHARS)],
                text: Annotated[str, msgspec.Meta(max_length=SAVE_TEXT_CHARS)], *,
                answers: str) -> str:
    """Save the answer to a file in the answers folder.

    Args:
        path: the file name, e.g. patents.md.
        text: the answer with its citations.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text.rstrip() + "\n")
    os.replace(tmp, path)           # whole or not at all: saving twice gives the same file
    return f"saved {path.name}"
