"""The ``pipeline`` command line: a click group over :mod:`ledgerflow.run`.

Modules: :mod:`.commands` (the commands), :mod:`.params` (``-p`` typing),
:mod:`.render` (progress, tables, JSON), :mod:`.guard` (errors and exit codes).
"""

from __future__ import annotations

from .commands import main

__all__ = ["main"]
