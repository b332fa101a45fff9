"""The doc_index index file: moved to the installed plugin :mod:`ledgerflow_docindex.store`.

Kept so that ``import doc_index_store`` (scripts, notebooks) goes on working::

    from doc_index_store import explain, write_document   # same as
    from ledgerflow_docindex.store import explain, write_document
"""

from __future__ import annotations

from ledgerflow_docindex.store import *  # noqa: F403
from ledgerflow_docindex.store import __all__  # noqa: F401
