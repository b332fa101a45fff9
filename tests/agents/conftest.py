"""Shared pieces of the model-provider tests: tool schemas and a request builder."""

from __future__ import annotations

from typing import Any

import pytest

SEARCH = {"name": "search_index",
          "description": "search the document index; returns passages with citations",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                         "required": ["query"]},
          "examples": [{"user": "find passages about the refund policy",
                        "arguments": {"query": "refund policy"}},
                       {"user": "what do the docs say about backups?",
                        "arguments": {"query": "backups"}}]}
READ = {"name": "read_document", "description": "read a whole document by its path",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]},
        "examples": [{"user": "open the file guide/setup.md",
                      "arguments": {"path": "guide/setup.md"}},
                     {"user": "show me manual/intro.txt",
                      "arguments": {"path": "manual/intro.txt"}}]}
SAVE = {"name": "save_answer", "description": "save text to a file",
        "parameters": {"type": "object",
                       "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                       "required": ["path", "text"]},
        "examples": [{"user": "write the text 'done' to the file status.txt",
                      "arguments": {"path": "status.txt", "text": "done"}},
                     {"user": "store the answer 'blue' in colors.md",
                      "arguments": {"path": "colors.md", "text": "blue"}}]}
TOOLS: list[dict[str, Any]] = [SEARCH, READ, SAVE]


def user(text: str) -> dict[str, str]:
    """A user message."""
    return {"role": "user", "content": text}


@pytest.fixture
def tools() -> list[dict[str, Any]]:
    """The three tools of the doc_qa recipe, as schemas."""
    return [dict(t) for t in TOOLS]
