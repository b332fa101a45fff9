"""The plugin manager: built-ins and third-party plugins load the same way.

Every plugin is listed in the ``ledgerflow`` entry-point group; the built-in
executors and stores in ``plugins/`` are registered through the very same
group by this distribution's ``pyproject.toml``. Set
``LEDGERFLOW_DISABLE_PLUGIN_AUTOLOAD=1`` to load only the built-ins.

The built-in plugins a command rarely needs (the executors, agents,
embedders, the index, the console, drafts, observers, Dask, PostgreSQL) are
**deferred**: they are
imported the first time something of theirs is asked for, so ``pipeline
status`` pays for none of them. :data:`DEFERRED` says, per entry-point
module, what a deferred plugin answers without being imported (the names it
lists) and which settings need it at start (an observer turned on by the
environment); any hook the core does not declare (a plugin's own hooks, such
as the model providers') and any listing of the plugins load them all.
"""

from __future__ import annotations

import importlib
import inspect
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from . import hookspecs
from .errors import PluginError

if TYPE_CHECKING:
    from .entrypoints import EntryPoint

BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("inline", "ledgerflow_executors.inline"),
    ("threads", "ledgerflow_executors.threads"),
    ("processes", "ledgerflow_executors.processes"),
    ("mock", "ledgerflow_executors.mock"),
    ("duckdb", "ledgerflow_stores.duckdb"),
    ("memory", "ledgerflow_stores.memory"),
)


@dataclass(frozen=True)
class Deferred:
    """What a deferred built-in plugin offers before it is imported."""

    #: ``ledgerflow_<kind>_names`` hook -> the names it answers (``executor``: ``dask``).
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: It adds ``pipeline`` commands (``ledgerflow_add_cli_commands``).
    commands: bool = False
    #: Environment settings that turn it on at start (loaded when any is set).
    env: tuple[str, ...] = ()


_OTEL_ENV = ("LEDGERFLOW_OTEL", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

#: Built-in plugins imported on first use, by entry-point module.
DEFERRED: dict[str, Deferred] = {
    # the executors: built when a run is made (``pipeline status`` imports none of them)
    **{f"ledgerflow_executors.{name}": Deferred(names={"executor": (name,)})
       for name in ("inline", "threads", "processes", "mock")},
    "ledgerflow_embed": Deferred(),
    "ledgerflow_embed.hashing": Deferred(),
    "ledgerflow_embed.minilm": Deferred(),
    "ledgerflow_docindex": Deferred(commands=True),
    "ledgerflow_dask": Deferred(names={"executor": ("dask",)}),
    "ledgerflow_console": Deferred(commands=True),
    "ledgerflow_agents": Deferred(),
    "ledgerflow_agents.mock": Deferred(),
    "ledgerflow_agents.local": Deferred(),
    "ledgerflow_agents.openai_compat": Deferred(),
    "ledgerflow_observability.otel": Deferred(env=_OTEL_ENV),
    "ledgerflow_observability.openlineage": Deferred(names={"lineage": ("openlineage",)},
                                                     env=("LEDGERFLOW_OPENLINEAGE",)),
    "ledgerflow_observability.prometheus": Deferred(env=("LEDGERFLOW_PROMETHEUS",)),
    "ledgerflow_drafts": Deferred(commands=True),
    "ledgerflow_postgres": Deferred(names={"store": ("postgres",)}, commands=True),
    "ledgerflow_watch": Deferred(commands=True),
}

_hookimpl = pluggy.HookimplMarker("ledgerflow")

_lock = threading.Lock()
_pm: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """Return the process-wide plugin manager, loading plugins on first use."""
    global _pm
    with _lock:
        if _pm is None:
            _pm = _build()
        return _pm


class _Relay(pluggy.HookRelay):  # type: ignore[misc]  # final for typing only
    """``pm.hook``: a hook the core does not declare loads the deferred plugins first.

    Its ``__dict__`` holds the hook callers only (pluggy walks it), so the loader
    is a class attribute of a subclass made per manager.
    """

    __slots__ = ()
    _loader: Any = None

    def __getattr__(self, name: str) -> Any:
        loader = type(self)._loader
        if loader is None or name.startswith("_"):
            raise AttributeError(name)
        loader()        # (another thread may have loaded them meanwhile)
        return object.__getattribute__(self, name)


class PluginManager(pluggy.PluginManager):
    """The ledgerflow plugin manager, with deferred built-ins (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("ledgerflow")
        self._deferred: list[tuple[EntryPoint, Deferred]] = []
        self._loading = False
        self._lock = threading.RLock()
        relay = type("_Relay", (_Relay,), {"__slots__": (),
                                           "_loader": staticmethod(self.load_deferred)})
        self.hook = relay()  # type: ignore[misc]  # no hook declared yet: none lost

    def defer(self, ep: EntryPoint, what: Deferred) -> None:
        self._deferred.append((ep, what))

    def waiting(self) -> list[tuple[EntryPoint, Deferred]]:
        """The deferred plugins not imported yet (a test or a plugin may have
        registered one itself)."""
        return [(ep, d) for ep, d in self._deferred if not self.has_plugin(ep.name)]

    def load(self, ep: EntryPoint) -> Any:
        """Import and register one deferred plugin; return its module."""
        with self._lock:
            if not self.has_plugin(ep.name):
                _register(self, _load(ep), ep.name, ep.value)
            return self.get_plugin(ep.name)

    def load_deferred(self) -> bool:
        """Import every deferred plugin not imported yet; True if any was."""
        with self._lock:
            if self._loading:
                return False
            todo = self.waiting()
            if not todo:
                return False
            for ep, _what in todo:
                self.load(ep)
            try:
                self.check_pending()
            except pluggy.PluginValidationError as exc:
                raise PluginError(str(exc),
                                  hint="check the hook names of that plugin") from exc
            return True

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        # a plugin's ledgerflow_addhooks looks its own hooks up while it registers:
        # that must not import the others (their hooks would not be declared yet)
        with self._lock:
            was, self._loading = self._loading, True
            try:
                return super().register(plugin, name)
            finally:
                self._loading = was

    def list_name_plugin(self) -> list[tuple[str, Any]]:
        self.load_deferred()
        return super().list_name_plugin()

    def get_plugins(self) -> set[Any]:
        self.load_deferred()
        return super().get_plugins()


class _Stubs:
    """The core hooks the deferred plugins answer: from :data:`DEFERRED`, importing a
    plugin only when what it offers is built or used."""

    def __init__(self, pm: PluginManager) -> None:
        self.pm = pm

    def _names(self, kind: str) -> list[str]:
        return [n for _ep, d in self.pm.waiting() for n in d.names.get(kind, ())]

    def _call(self, kind: str, wanted: str, hook: str, kwargs: dict[str, Any]) -> Any:
        for ep, d in self.pm.waiting():
            if wanted in d.names.get(kind, ()):
                return _call(self.pm.load(ep), hook, kwargs)
        return None

    @_hookimpl
    def ledgerflow_executor_names(self) -> list[str]:
        return self._names("executor")

    @_hookimpl
    def ledgerflow_make_executor(self, name: str, settings: Any) -> Any:
        return self._call("executor", name, "ledgerflow_make_executor",
                          {"name": name, "settings": settings})

    @_hookimpl
    def ledgerflow_store_names(self) -> list[str]:
        return self._names("store")

    @_hookimpl
    def ledgerflow_make_store(self, name: str, settings: Any) -> Any:
        return self._call("store", name, "ledgerflow_make_store",
                          {"name": name, "settings": settings})

    @_hookimpl
    def ledgerflow_lineage_formats(self) -> list[str]:
        return self._names("lineage")

    @_hookimpl
    def ledgerflow_export_lineage(self, format: str, run_id: str, store: Any,
                                  path: str) -> int | None:
        written: int | None = self._call(
            "lineage", format, "ledgerflow_export_lineage",
            {"format": format, "run_id": run_id, "store": store, "path": path})
        return written

    @_hookimpl
    def ledgerflow_add_cli_commands(self, group: Any) -> None:
        for ep, d in self.pm.waiting():
            if d.commands:
                _call(self.pm.load(ep), "ledgerflow_add_cli_commands", {"group": group})


def _call(plugin: Any, hook: str, kwargs: dict[str, Any]) -> Any:
    """Call ``plugin``'s implementation of ``hook`` (with the arguments it takes)."""
    fn = getattr(plugin, hook, None)
    if fn is None:
        return None
    takes = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in takes})


def _load(ep: EntryPoint) -> Any:
    try:
        return ep.load()
    except Exception as exc:  # a broken third-party plugin must not hide the others
        raise PluginError(
            f"plugin {ep.name!r} ({ep.value}) failed to import: {exc}",
            hint="fix or uninstall it, or set LEDGERFLOW_DISABLE_PLUGIN_AUTOLOAD=1") from exc


def _build() -> PluginManager:
    pm = PluginManager()
    pm.add_hookspecs(hookspecs)
    pm.hook.ledgerflow_addhooks.call_historic(kwargs={"pluginmanager": pm})
    autoload = not os.environ.get("LEDGERFLOW_DISABLE_PLUGIN_AUTOLOAD")
    seen: set[str] = set()
    if autoload:
        from .entrypoints import entry_points  # (remembered while the packages stay)
        for ep in entry_points("ledgerflow"):
            if ep.name in seen or pm.has_plugin(ep.name):
                continue
            seen.add(ep.name)
            what = DEFERRED.get(ep.value)
            if what is not None and not any(os.environ.get(k) for k in what.env):
                pm.defer(ep, what)
                continue
            _register(pm, _load(ep), ep.name, ep.value)
    for name, module in BUILTIN_PLUGINS:
        if name not in seen and not pm.has_plugin(name):
            _register(pm, importlib.import_module(module), name, module)
    if pm.waiting():
        pm.register(_Stubs(pm), name="ledgerflow-deferred")
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
        if isinstance(plugin, _Stubs):
            continue
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
