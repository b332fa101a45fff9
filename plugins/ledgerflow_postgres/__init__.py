"""The ``postgres`` store plugin: one ledger in PostgreSQL for drivers on many machines.

Selected by a ``postgresql://`` (or ``postgres://``) store location:
``--store postgresql://host/db`` or ``LEDGERFLOW_STORE``. Needs
``pip install 'ledgerflow[postgres]'`` (psycopg 3 and its pool); imported
lazily, so ``import ledgerflow`` does not pay for it. Modules, one concept
each: :mod:`.store` (the store), :mod:`.schema` (tables, migrations),
:mod:`.sql` (the group-commit statement derived from the record
declarations), :mod:`.connection` (connecting, waiting out an outage),
:mod:`.lease` (leases on the server's clock, renewal, signals),
:mod:`.blobs` (large results in a shared directory), :mod:`.queries`
(reads), :mod:`.worker` (``pipeline worker``). See ``README.md`` here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ledgerflow import hookimpl
from ledgerflow.config import Settings
from ledgerflow.errors import PluginError

if TYPE_CHECKING:
    import click

    from .store import PostgresStore

__all__ = ["PostgresStore"]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from .store import PostgresStore
        return PostgresStore
    raise AttributeError(name)


@hookimpl
def ledgerflow_store_names() -> list[str]:
    return ["postgres"]


@hookimpl
def ledgerflow_make_store(name: str, settings: Settings) -> PostgresStore | None:
    if name != "postgres":
        return None
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise PluginError(f"the postgres store needs psycopg 3 and psycopg-pool ({exc})",
                          hint="pip install 'ledgerflow[postgres]'") from None
    return _shared(settings.store)


_STORES: dict[tuple[str, ...], Any] = {}


def _shared(url: str) -> PostgresStore:
    """One store per database and settings per process: its connections, lease keeper
    and reader pool serve every run and reader of this process (closed at exit)."""
    import atexit
    import os

    from .store import PostgresStore
    key = (url, *(os.environ.get(f"LEDGERFLOW_{v}", "") for v in
                  ("LEASE_TTL", "STORE_WAIT", "BLOB_DIR")), os.getcwd())
    st = _STORES.get(key)
    if st is None:
        if not _STORES:
            atexit.register(_close_all)
        st = _STORES[key] = PostgresStore(url)
    return st


def _close_all() -> None:
    for st in list(_STORES.values()):
        try:
            st.close()
        except Exception:  # the database may be gone at exit: nothing to release then
            pass


@hookimpl
def ledgerflow_add_cli_commands(group: click.Group) -> None:
    from .worker import worker_command
    group.add_command(worker_command)
