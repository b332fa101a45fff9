"""The ``pipeline`` command line: a click group over :mod:`ledgerflow.control`.

Modules: :mod:`.options` (the group, shared options), one module per command
family (:mod:`.drive` run/submit/resume/cancel, :mod:`.inspect`
status/logs/runs/lineage/graph/usage, :mod:`.approvals`, :mod:`.ledger`
plugins/fold/doctor/repair), :mod:`.params` (``-p`` typing), :mod:`.render`
(progress, tables, JSON), :mod:`.guard` (errors and exit codes),
:mod:`.drafts` (``spec-schema``, ``validate``, ``approve-draft``).
"""

from __future__ import annotations

from . import approvals as _approvals  # noqa: F401  (each family registers its commands)
from . import drafts as _drafts  # noqa: F401
from . import drive as _drive  # noqa: F401
from . import explain as _explain  # noqa: F401  (pipeline explain)
from . import inspect as _inspect  # noqa: F401
from . import ledger as _ledger  # noqa: F401
from .options import main

__all__ = ["main"]
