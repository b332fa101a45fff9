"""Read the README's own code blocks, so the tests run what a reader copies (no drift)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def section(heading: str) -> str:
    """The text under ``## heading`` up to the next heading of the same or a higher level."""
    text = README.read_text()
    start = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.M)
    if start is None:
        raise LookupError(f"README.md has no section {heading!r}")
    level = len(start.group(1))
    rest = text[start.end():]
    fenced, at = False, 0
    for line in rest.splitlines(keepends=True):     # a "# comment" in a code block is no heading
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            return rest[:at]
        at += len(line)
    return rest


def blocks(heading: str, lang: str | None = None) -> list[str]:
    """The fenced code blocks of a section, in order (``lang`` keeps only that language)."""
    return [body for kind, body in _FENCE.findall(section(heading))
            if lang is None or kind == lang]


def commands(block: str) -> list[list[str]]:
    """Each command line of a shell block as argv: comments dropped, continuations joined."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words and not words[0].startswith(("export",)):
            out.append(words)
    return out
