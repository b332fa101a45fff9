"""Deciding approval requests from any process: moved to :mod:`ledgerflow.gates`.

Kept so that ``ledgerflow.deciding`` still imports (``control`` and the spec
wing use it); new code imports :mod:`ledgerflow.gates`.
"""

from __future__ import annotations

from .gates import MIN_PREFIX, apply_deadlines, approve, overlay, pending, reject

__all__ = ["MIN_PREFIX", "apply_deadlines", "approve", "overlay", "pending", "reject"]
