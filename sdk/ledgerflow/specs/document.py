"""Reading a spec file: its document (JSON or TOML) and the pipeline it describes.

:func:`read_document` parses the file (nothing it names is imported);
:func:`load_spec` returns a :class:`~ledgerflow.specs.pipeline.SpecPipeline`,
which checks the steps only when its graph is built.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError
from . import drafts
from .pipeline import SpecPipeline


def read_document(path: str | Path) -> tuple[Any, str]:
    """Parse a spec file; return (document, text).

    Raises:
        InputError: unreadable file, or not valid JSON/TOML.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(f"cannot read spec {path}: {exc.strerror}",
                         hint="pass an existing .json or .toml file") from None
    try:
        if p.suffix == ".toml":
            import tomllib
            doc = tomllib.loads(text)
        else:
            doc = json.loads(text)
    except ValueError as exc:
        raise InputError(f"spec {path} is not valid {p.suffix[1:].upper() or 'JSON'}: {exc}",
                         hint="fix the file's syntax") from None
    return doc, text


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
