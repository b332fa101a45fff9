"""The keyword terms of the doc index: one tokenizer for chunks and queries alike.

The index's ``postings`` table holds these terms for every chunk; a query is
cut the same way, so both sides of BM25 agree. Changing this module changes
what ``update_index`` writes (the recipe's task versions cover it).
"""

from __future__ import annotations

import re

_TERM = re.compile(r"[^\W_]+")

#: Words too common to be worth marking in a snippet (BM25 still scores them).
UNMARKED = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to "
    "was were will with".split())


def normalize_term(word: str) -> str | None:
    """One word as the index keeps it: lowercase, a plural "s" stripped; None if too short.

    Example:
        >>> normalize_term("Patents"), normalize_term("class"), normalize_term("a")
        ('patent', 'class', None)
    """
    word = word.lower()
    if len(word) < 2:
        return None
    if len(word) > 3 and word[-1] == "s" and word[-2] != "s":
        word = word[:-1]
    return word


def index_terms(text: str) -> list[str]:
    """The keyword-index terms of ``text``, in order (used for chunks and queries alike).

    Lowercase runs of letters and digits, 1-character words dropped, a plural
    "s" stripped from words of 4+ letters ("patents" -> "patent"; "class" stays).

    Example:
        >>> index_terms("The Patents, e.g. of a class")
        ['the', 'patent', 'of', 'class']
    """
    out = []
    for word in _TERM.findall(text.lower()):
        term = normalize_term(word)
        if term is not None:
            out.append(term)
    return out


def keyword_terms(doc_id: str, text: str) -> list[str]:
    """What the keyword index holds for a chunk: the terms of its document id and its text.

    The document id (its path: folder and file name words, e.g. "licenses apache
    2.0 txt") counts as part of every chunk, so a query naming the document
    matches all of its chunks.
    """
    return index_terms(doc_id) + index_terms(text)


def term_spans(text: str, terms: set[str]) -> list[tuple[int, int]]:
    """``(start, end)`` of every word of ``text`` whose index term is in ``terms``.

    Words in :data:`UNMARKED` are left out (they match nearly every chunk).

    Example:
        >>> term_spans("Grant of Patent License", {"patent", "license", "of"})
        [(9, 15), (16, 23)]
    """
    spans = []
    for match in _TERM.finditer(text):
        term = normalize_term(match.group())
        if term is not None and term in terms and term not in UNMARKED:
            spans.append(match.span())
    return spans
