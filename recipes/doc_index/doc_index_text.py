"""Pure text functions of the doc_index recipe: find, read, clean and chunk documents.

Nothing here knows about runs or tasks; the tasks in ``pipeline.py`` are thin
wrappers, and these functions are unit-tested directly. (``index_terms``, the
keyword tokenizer, is re-exported from :mod:`ledgerflow_docindex.terms`.)
"""

from __future__ import annotations

import fnmatch
import hashlib
import html
import io
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

# the keyword tokenizer lives with the index (the CLI and a console search with it)
from ledgerflow_docindex.terms import index_terms  # noqa: F401

#: File suffix (lowercase) -> format name.
FORMATS: dict[str, str] = {
    ".txt": "text",
    ".text": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
}


class DocumentError(Exception):
    """A document cannot be read (corrupt PDF, unknown format...)."""


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def text_hash(text: str) -> str:
    """Hex SHA-256 of ``text`` encoded as UTF-8 (the chunk content hash)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_hash(path: Path, block: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- discover


def discover_documents(source: str | Path, exclude: Sequence[str] = (), *,
                       skipped: list[tuple[str, str]] | None = None) -> list[dict[str, str]]:
    """List the supported documents under ``source`` (recursively), sorted by id.

    Each entry is ``{"doc_id", "path", "content_hash", "format"}``: ``doc_id`` is
    the POSIX path relative to ``source`` (the file name when ``source`` is a
    file), ``path`` the absolute path, ``content_hash`` the SHA-256 of the bytes.
    Hidden files and folders (name starting with ``.``) are skipped, as are
    paths matching one of the ``exclude`` glob patterns (matched against the
    ``doc_id`` and the file name).

    A symlink whose target is outside ``source`` (``notes.txt -> /etc/passwd``)
    is skipped, and added to ``skipped`` as ``(doc_id, target)``: only files
    inside the folder are indexed. A symlink to a file inside it is listed;
    symlinked folders are not descended into.

    Raises:
        FileNotFoundError: ``source`` does not exist.
    """
    root = Path(source).expanduser().resolve()
    if not root.exists():
        raise FileNotFoundError(f"source {str(source)!r} does not exist")
    if root.is_file():
        candidates: Iterable[tuple[Path, str]] = [(root, root.name)]
    else:
        candidates = ((p, p.relative_to(root).as_posix()) for p in root.rglob("*"))
    docs = []
    for path, doc_id in candidates:
        fmt = FORMATS.get(path.suffix.lower())
        if fmt is None or not path.is_file():
            continue
        if any(part.startswith(".") for part in Path(doc_id).parts):
            continue
        if any(fnmatch.fnmatch(doc_id, pat) or fnmatch.fnmatch(path.name, pat)
               for pat in exclude):
            continue
        if path != root and not path.resolve().is_relative_to(root):
            if skipped is not None:
                skipped.append((doc_id, str(path.resolve())))
            continue
        docs.append({"doc_id": doc_id, "path": str(path), "content_hash": file_hash(path),
                     "format": fmt})
    docs.sort(key=lambda d: d["doc_id"])
    return docs


# --------------------------------------------------------------------------- read


def decode_text(data: bytes) -> str:
    """Decode bytes as UTF-8 (BOM allowed), falling back to cp1252, then Latin-1."""
    for encoding in ("utf-8-sig", "cp1252"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    return data.decode("latin-1")


def pdf_text(data: bytes) -> str:
    """Extract the text of a PDF, pages separated by blank lines.

    Raises:
        DocumentError: the bytes are not a readable PDF.
    """
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PyPdfError, ValueError, KeyError, TypeError) as exc:
        raise DocumentError(f"not a readable PDF: {exc}") from exc
    return "\n\n".join(pages)


def extract_text(data: bytes, fmt: str) -> str:
    """Return the raw text of a document (markup still in; PDFs as plain text)."""
    if fmt == "pdf":
        return pdf_text(data)
    if fmt in ("text", "markdown", "html"):
        return decode_text(data)
    raise DocumentError(f"unsupported format {fmt!r}; supported: {sorted(set(FORMATS.values()))}")


# --------------------------------------------------------------------------- clean

_BLOCK_TAGS = frozenset({
    "address", "article", "aside", "blockquote", "br", "caption", "dd", "div", "dl", "dt",
    "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
    "hr", "li", "main", "nav", "ol", "p", "pre", "section", "table", "tbody", "td", "th",
    "thead", "title", "tr", "ul",
})
_SKIP_TAGS = frozenset({"script", "style", "template", "noscript", "svg", "head"})


class _HTMLText(HTMLParser):
    """Collect the visible text of an HTML page; block elements end paragraphs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0
        self.title: list[str] = []
        self.in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self.in_title = True
        elif tag in _SKIP_TAGS:
            self.skip += 1
        if tag in _BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        elif tag in _SKIP_TAGS and self.skip:
            self.skip -= 1
        if tag in _BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title.append(data)
        elif not self.skip:
            self.parts.append(data)


def strip_html(text: str) -> str:
    """Return the visible text of an HTML document (title first, scripts and styles dropped)."""
    parser = _HTMLText()
    parser.feed(text)
    parser.close()
    title = " ".join("".join(parser.title).split())
    body = "".join(parser.parts)
    return f"{title}\n\n{body}" if title else body


_MD_FRONT_MATTER = re.compile(r"\A---\s*\n.*?\n---\s*\n", re.S)
_MD_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_MD_REF_LINK = re.compile(r"\[([^\]]+)\]\[[^\]]*\]")
_MD_LINK_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+\S+.*$", re.M)
_MD_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s*(.*?)\s*#*\s*$", re.M)
_MD_SETEXT = re.compile(r"^\s*(=+|-+)\s*$", re.M)
_MD_QUOTE = re.compile(r"^\s*>+\s?", re.M)
_MD_BULLET = re.compile(r"^(\s*)(?:[-*+]|\d+[.)])\s+", re.M)
_MD_RULE = re.compile(r"^\s*(?:[-*_]\s*){3,}$", re.M)
_MD_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$", re.M)
_MD_EMPHASIS = re.compile(r"(\*{1,3})(?=\S)(.+?)(?<=\S)\1")
_MD_UNDERSCORE = re.compile(r"(?<!\w)(_{1,3})(?=\S)(.+?)(?<=\S)\1(?!\w)")
_MD_FENCED_BLOCK = re.compile(r"^[ ]{0,3}(```|~~~)[^\n]*\n(.*?)(?:^[ ]{0,3}\1[^\n]*$|\Z)", re.M | re.S)
_MD_CODE = re.compile(r"`+([^`]*)`+")
_MD_HTML_TAG = re.compile(r"</?[A-Za-z][^>\n]*>|<!--.*?-->", re.S)


def strip_markdown(text: str) -> str:
    """Remove Markdown syntax, keeping the words (link text, image alt text, code).

    Fenced code blocks are kept verbatim (without the fences); everything
    else loses headings, emphasis, links, list bullets, quotes and tables.
    """
    text = _MD_FRONT_MATTER.sub(lambda m: m.group(0).replace("---", "") + "\n", text, count=1)
    out: list[str] = []
    pos = 0
    for m in _MD_FENCED_BLOCK.finditer(text):
        out.append(_strip_markdown_prose(text[pos:m.start()]))
        out.append("\n\n" + m.group(2) + "\n\n")
        pos = m.end()
    out.append(_strip_markdown_prose(text[pos:]))
    return "".join(out)


def _strip_markdown_prose(text: str) -> str:
    text = _MD_LINK_DEF.sub("", text)
    text = _MD_IMAGE.sub(r"\1", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_REF_LINK.sub(r"\1", text)
    text = _MD_AUTOLINK.sub(r"\1", text)
    text = _MD_HTML_TAG.sub(" ", text)
    text = _MD_TABLE_SEP.sub("", text)
    text = _MD_RULE.sub("", text)
    text = _MD_HEADING.sub(lambda m: "\n" + m.group(1) + "\n", text)
    text = _MD_SETEXT.sub("", text)
    text = _MD_QUOTE.sub("", text)
    text = _MD_BULLET.sub(r"\1", text)
    text = _MD_CODE.sub(r"\1", text)
    text = _MD_EMPHASIS.sub(r"\2", text)
    text = _MD_UNDERSCORE.sub(r"\2", text)
    text = text.replace("|", " ")
    return html.unescape(text)


_ZERO_WIDTH = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"), None)
_SPACES = re.compile(r"[^\S\n]+")
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")


def normalize_whitespace(text: str) -> str:
    """Unify whitespace: paragraphs separated by one blank line, lines within joined.

    Hard-wrapped lines inside a paragraph become one line, runs of spaces and
    tabs one space, and leading/trailing space goes.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n\n")
    paragraphs = _PARAGRAPH_BREAK.split(text)
    cleaned = (_SPACES.sub(" ", p.replace("\n", " ")).strip() for p in paragraphs)
    return "\n\n".join(p for p in cleaned if p)


def clean_text(text: str, fmt: str = "text") -> str:
    """Normalise a document's text for chunking and search.

    Steps: strip HTML (``fmt="html"``) or Markdown (``fmt="markdown"``) markup,
    Unicode NFKC normalisation (ligatures, full-width forms, non-breaking
    spaces), removal of zero-width and control characters, then whitespace
    normalisation (:func:`normalize_whitespace`).

    Example:
        >>> clean_text("<p>Cafe&#769;&nbsp; <b>ﬁne</b></p>", "html")
        'Café fine'
    """
    if fmt == "html":
        text = strip_html(text)
    elif fmt == "markdown":
        text = strip_markdown(text)
    text = unicodedata.normalize("NFKC", text).translate(_ZERO_WIDTH)
    text = "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc" else " " for c in text)
    return normalize_whitespace(text)


# --------------------------------------------------------------------------- titles


def document_title(doc_id: str) -> str:
    """Words naming a document, from its id: ``"licenses/apache-2.0.txt"`` -> ``"licenses apache-2.0"``.

    Prefixed to every chunk before embedding so that each chunk carries the
    context of its document (the keyword index does the same with ``doc_id``).
    """
    path = doc_id.rsplit(".", 1)[0] if "." in doc_id.rsplit("/", 1)[-1] else doc_id
    return " ".join(part.replace("_", " ") for part in path.split("/") if part)



@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a document: ``text == document[start:end]``."""

    position: int
    start: int
    end: int
    text: str
    content_hash: str

    def as_dict(self) -> dict[str, object]:
        """A JSON-able dict of the fields."""
        return {"position": self.position, "start": self.start, "end": self.end,
                "text": self.text, "content_hash": self.content_hash}


_WORD = re.compile(r"\S+")
_SENTENCE_END = (".", "!", "?", ":", ";")


def check_chunk_params(size: int, overlap: int) -> None:
    """Raise ``ValueError`` unless ``size > 0`` and ``0 <= overlap < size``."""
    if size < 1:
        raise ValueError(f"chunk size must be at least 1 character, given: {size}")
    if overlap < 0 or overlap >= size:
        raise ValueError(f"overlap must be at least 0 and smaller than the chunk size "
                         f"({size}), given: {overlap}")


def chunk_text(text: str, size: int = 800, overlap: int = 100) -> list[Chunk]:
    """Cut ``text`` into chunks of at most ``size`` characters, never inside a word.

    Words are maximal runs of non-space characters. A chunk is a run of whole
    words ``text[start:end]``; it ends preferably at a paragraph break, else at
    the end of a sentence, provided the chunk is at least 60% of ``size``
    long. The next chunk starts with the last words of the previous one that
    fit in ``overlap`` characters (never more than ``overlap`` characters are
    repeated), and always starts at least one word later, so the chunking ends.
    A single word longer than ``size`` becomes a chunk of its own (longer
    than ``size``) rather than being split.

    Example:
        >>> [c.text for c in chunk_text("one two three four five", size=9, overlap=4)]
        ['one two', 'two three', 'four five']
    """
    check_chunk_params(size, overlap)
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    chunks: list[Chunk] = []
    i = 0
    n = len(words)
    while i < n:
        start = words[i][0]
        j = i
        while j + 1 < n and words[j + 1][1] - start <= size:
            j += 1
        if j + 1 < n:  # not the last chunk: prefer a natural boundary
            j = _best_end(text, words, i, j, start, size)
        end = words[j][1]
        piece = text[start:end]
        chunks.append(Chunk(len(chunks), start, end, piece, text_hash(piece)))
        if j + 1 >= n:
            break
        k = j + 1  # first word of the next chunk: go back while the overlap fits
        while k - 1 > i and end - words[k - 1][0] <= overlap:
            k -= 1
        while k <= j and words[j + 1][1] - words[k][0] > size:
            k += 1  # the overlap must leave room for at least one new word
        i = k
    return chunks


def _best_end(text: str, words: list[tuple[int, int]], i: int, j: int, start: int,
              size: int) -> int:
    """Index of the word to end a chunk with: a paragraph end, else a sentence end, else j."""
    floor = start + int(0.6 * size)
    sentence = None
    for w in range(j, i, -1):
        w_end = words[w][1]
        if w_end < floor:
            break
        gap = text[w_end:words[w + 1][0]]
        if "\n\n" in gap:
            return w
        if sentence is None and text[w_end - 1] in _SENTENCE_END:
            sentence = w
    return sentence if sentence is not None else j
