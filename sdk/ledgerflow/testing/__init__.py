"""Contract test suites shipped for plugin authors: stores and executors.

Subclass :class:`StoreContract` (set ``store_name``) or
:class:`ExecutorContract` (set ``executor_name``) in your tests; pytest
collects the inherited tests. Both build their subject through the plugin
manager, as a run does, and import no plugin themselves.
"""

from __future__ import annotations

from .executors import ExecutorContract
from .stores import StoreContract

__all__ = ["ExecutorContract", "StoreContract"]
