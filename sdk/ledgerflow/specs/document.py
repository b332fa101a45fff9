"""Reading a spec file: its document (JSON or TOML) and the pipeline it describes.

:func:`read_document` parses the file (nothing it names is imported);
:func:`load_spec` returns a :class:`~ledgerflow.specs.pipeline.SpecPipeline`,
which checks the steps only when its graph is built.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from ..errors import InputError
from . import drafts
from .pipeline import SpecPipeline

#: How deep a spec's values may nest (tables and lists); a real spec needs a handful.
MAX_DEPTH: Final = 100


def read_document(path: str | Path) -> tuple[Any, str]:
    """Parse a spec file; return (document, text).

    Raises:
        InputError: unreadable file, not UTF-8 text, not valid JSON/TOML, or values
            nested deeper than :data:`MAX_DEPTH`.
    """
    p = Path(path)
    kind = p.suffix[1:].upper() if p.suffix == ".toml" else "JSON"
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read spec {path}: {exc.strerror}",
                         hint="pass an existing .json or .toml file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"spec {path} is not valid UTF-8 text: byte 0x{raw[exc.start]:02x} at "
                         f"offset {exc.start}", hint="save the file as UTF-8") from None
    try:
        if p.suffix == ".toml":
            import tomllib
            doc = tomllib.loads(text)
        else:
            doc = json.loads(text)
    except RecursionError:
        raise InputError(f"spec {path} is not valid {kind}: its values nest too deeply to "
                         "read", hint=f"a spec nests tables and lists at most {MAX_DEPTH} "
                         "levels deep") from None
    except ValueError as exc:
        raise InputError(f"spec {path} is not valid {kind}: {exc}",
                         hint="fix the file's syntax") from None
    if _depth(doc) > MAX_DEPTH:
        raise InputError(f"spec {path} is not valid {kind}: its values nest more than "
                         f"{MAX_DEPTH} levels deep",
                         hint=f"a spec nests tables and lists at most {MAX_DEPTH} levels deep")
    return doc, text


def _depth(doc: object) -> int:
    """How deep tables and lists nest in ``doc`` (without recursion; stops past MAX_DEPTH)."""
    deepest = 0
    todo: list[tuple[object, int]] = [(doc, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        todo.extend((c, depth + 1) for c in children)
    return deepest


def load_spec(path: str | Path) -> SpecPipeline:
    """Read a spec file and return a pipeline whose graph it describes."""
    p = Path(path)
    doc, text = read_document(p)
    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), dict):
        raise InputError(f"spec {path} has no [tasks] table",
                         hint="list tasks as tasks.<name> = {task = 'module:function'}")
    folder = str(p.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = str(doc.get("name") or p.stem)
    return SpecPipeline(name, doc["tasks"], str(p.resolve()), doc=doc,
                        header=drafts.parse_header(text, doc))
