"""The ``pipeline`` command line: a click group over :mod:`ledgerflow.control`.

Modules: :mod:`.commands` (the commands), :mod:`.params` (``-p`` typing),
:mod:`.render` (progress, tables, JSON), :mod:`.guard` (errors and exit codes),
:mod:`.drafts` (``spec-schema``, ``validate``, ``approve-draft``).
"""

from __future__ import annotations

from . import drafts as _drafts  # noqa: F401  (its commands register on main)
from .commands import main

__all__ = ["main"]
