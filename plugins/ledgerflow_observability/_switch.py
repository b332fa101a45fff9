"""Turning an observer on and off: registering its hook implementations or not.

An observer that is off has no hook implementation registered, so a run
calls nothing for it (the runner skips hooks nobody implements). The entry
point module of each observer registers it when its environment setting is
on (``ledgerflow_addhooks``, while the plugin manager is built); tests and
notebooks turn it on and off with :meth:`Switch.enable` / :meth:`Switch.disable`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pluggy


class Switch:
    """Whether one observer's hook implementations are registered."""

    def __init__(self, name: str, build: Callable[..., Any]) -> None:
        self.name = name
        self._build = build
        self._lock = threading.Lock()
        self.observer: Any = None

    def register(self, pm: pluggy.PluginManager, **options: Any) -> Any:
        """Register a fresh observer built with ``options`` (replacing the current one)."""
        with self._lock:
            if self.observer is not None and pm.is_registered(self.observer):
                pm.unregister(self.observer)
                _close(self.observer)
            self.observer = self._build(**options)
            pm.register(self.observer, name=self.name)
            return self.observer

    def enable(self, **options: Any) -> Any:
        """Turn the observer on in this process; return it."""
        from ledgerflow.plugins import get_plugin_manager
        return self.register(get_plugin_manager(), **options)

    def disable(self) -> None:
        """Turn the observer off in this process (it finishes what it had started)."""
        from ledgerflow.plugins import get_plugin_manager
        pm = get_plugin_manager()
        with self._lock:
            obs, self.observer = self.observer, None
            if obs is not None and pm.is_registered(obs):
                pm.unregister(obs)
            if obs is not None:
                _close(obs)

    @property
    def enabled(self) -> bool:
        """True while an observer is registered."""
        return self.observer is not None


def _close(observer: Any) -> None:
    close = getattr(observer, "close", None)
    if callable(close):
        close()
