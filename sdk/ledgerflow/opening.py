"""Opening what a run is driven with: its settings, its store and its executor, through
the plugins (a memory store is one object per name per process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

from .config import Settings, store_kind_for
from .errors import PluginError
from .plugins import get_plugin_manager
from .store import RunStore

if TYPE_CHECKING:
    from .executor import Executor


def _installed(hook: str) -> list[str]:
    pm = get_plugin_manager()
    return sorted({n for ns in getattr(pm.hook, hook)() for n in ns})


def open_store(settings: Settings) -> RunStore:
    """Build the store named by ``settings.store_kind`` through the plugins."""
    pm = get_plugin_manager()
    store = pm.hook.ledgerflow_make_store(name=settings.store_kind, settings=settings)
    if store is None:
        raise PluginError(f"store {settings.store_kind!r} not found; installed: "
                          + ", ".join(_installed("ledgerflow_store_names")),
                          hint="install a plugin that provides it, or set "
                          "LEDGERFLOW_STORE_KIND=duckdb")
    return store  # type: ignore[no-any-return]


def check_executor(name: str | None) -> None:
    """Raise PluginError unless an executor plugin offers ``name``."""
    if name is None:
        return
    names = _installed("ledgerflow_executor_names")
    if name not in names:
        raise PluginError(f"executor {name!r} not found; installed: " + ", ".join(names),
                          hint="install a plugin that provides it, or use --executor threads")


def make_executor(name: object, settings: Settings) -> Executor:
    """Build the executor called ``name`` (or pass an instance through)."""
    if not isinstance(name, str):
        from .executor import Executor  # the executor protocol: when a run is made
        if not isinstance(name, Executor):
            raise PluginError(f"{name!r} is not an executor (no start/submit/cancel/shutdown)",
                              hint="pass an executor name, e.g. executor='threads'")
        return name
    check_executor(name)
    ex = get_plugin_manager().hook.ledgerflow_make_executor(name=name, settings=settings)
    if ex is None:
        raise PluginError(f"executor plugin for {name!r} built nothing",
                          hint="check the plugin's ledgerflow_make_executor hook")
    return ex  # type: ignore[no-any-return]


_MEMORY_STORES: dict[str, RunStore] = {}


#: Where a run is recorded: a store location (``:memory:``/``memory:NAME`` for the
#: memory store), a store object, or None (``LEDGERFLOW_STORE`` or the default).
StoreArg = Union[str, RunStore, None]  # noqa: UP007


def settings_for(store: StoreArg = None, executor: object = None,
                 workers: int | None = None, fail_fast: bool | None = None,
                 **extra: Any) -> Settings:
    """Settings from the environment with these overrides (None: not given)."""
    extra = {k: v for k, v in extra.items() if v is not None}
    kw: dict[str, Any] = {"workers": workers, "fail_fast": fail_fast}
    if isinstance(executor, str):
        kw["executor"] = executor
    if isinstance(store, str):
        if store == ":memory:" or store.startswith("memory:"):
            kw["store_kind"] = "memory"
        elif store_kind_for(store) is not None:     # postgresql://... names its plugin
            kw["store_kind"] = store_kind_for(store)
        kw["store"] = store
    elif store is not None:
        kw["store"], kw["store_kind"] = store.location, store.name
    kw.update(extra)
    return Settings.from_env(**kw)


def store_for(settings: Settings, given: StoreArg = None) -> RunStore:
    """The store of ``settings`` (one memory store per name per process), or ``given``
    if it is a store object."""
    if given is not None and not isinstance(given, str):
        return given
    if settings.store_kind == "memory":
        st = _MEMORY_STORES.get(settings.store)
        if st is None:
            st = _MEMORY_STORES[settings.store] = open_store(settings)
        return st
    return open_store(settings)


def open_ledger(store: StoreArg = None) -> RunStore:
    """The store at ``store`` (default: ``LEDGERFLOW_STORE`` or ``.ledgerflow/``)."""
    return store_for(settings_for(store), store)
