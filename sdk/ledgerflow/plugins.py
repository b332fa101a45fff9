"""The plugin manager: built-ins and third-party plugins load the same way.

Every plugin is listed in the ``ledgerflow`` entry-point group; the built-in
executors and stores in ``plugins/`` are registered through the very same
group by this distribution's ``pyproject.toml``. Set
``LEDGERFLOW_DISABLE_PLUGIN_AUTOLOAD=1`` to load only the built-ins.
"""

from __future__ import annotations

import importlib
import os
import threading
from importlib.metadata import entry_points

import pluggy

from . import hookspecs
from .errors import PluginError

BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("inline", "ledgerflow_executors.inline"),
    ("threads", "ledgerflow_executors.threads"),
    ("processes", "ledgerflow_executors.processes"),
    ("mock", "ledgerflow_executors.mock"),
    ("duckdb", "ledgerflow_stores.duckdb"),
    ("memory", "ledgerflow_stores.memory"),
)

_lock = threading.Lock()
_pm: pluggy.PluginManager | None = None


def get_plugin_manager() -> pluggy.PluginManager:
    """Return the process-wide plugin manager, loading plugins on first use."""
    global _pm
    with _lock:
        if _pm is None:
            _pm = _build()
        return _pm


def _build() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("ledgerflow")
    pm.add_hookspecs(hookspecs)
    pm.hook.ledgerflow_addhooks.call_historic(kwargs={"pluginmanager": pm})
    autoload = not os.environ.get("LEDGERFLOW_DISABLE_PLUGIN_AUTOLOAD")
    seen: set[str] = set()
    if autoload:
        for ep in entry_points(group="ledgerflow"):
            if ep.name in seen or pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party plugin must not hide the others
                raise PluginError(
                    f"plugin {ep.name!r} ({ep.value}) failed to import: {exc}",
                    hint="fix or uninstall it, or set LEDGERFLOW_DISABLE_PLUGIN_AUTOLOAD=1") from exc
            _register(pm, plugin, ep.name, ep.value)
            seen.add(ep.name)
    for name, module in BUILTIN_PLUGINS:
        if name not in seen and not pm.has_plugin(name):
            _register(pm, importlib.import_module(module), name, module)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(str(exc), hint="check the hook names of that plugin") from exc
    return pm


def _register(pm: pluggy.PluginManager, plugin: object, name: str, where: str) -> None:
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name!r} from {where} is invalid: {exc}",
                          hint="fix its hook implementations to match ledgerflow.hookspecs") from exc


def plugin_table() -> list[tuple[str, str, list[str]]]:
    """Return ``(name, module or file, provided names)`` for each registered plugin."""
    pm = get_plugin_manager()
    rows = []
    for name, plugin in pm.list_name_plugin():
        provides: list[str] = []
        for hook in sorted(dir(plugin)):   # ledgerflow_<kind>_names hooks of any plugin
            if hook.startswith("ledgerflow_") and hook.endswith("_names"):
                fn = getattr(plugin, hook)
                if callable(fn):
                    kind = hook[len("ledgerflow_"):-len("_names")]
                    provides += [f"{kind}:{n}" for n in fn()]
        where = getattr(plugin, "__file__", None) or getattr(plugin, "__name__", repr(plugin))
        rows.append((name or "?", str(where), provides))
    return rows
