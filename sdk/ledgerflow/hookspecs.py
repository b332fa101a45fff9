"""Hook specifications: how plugins provide executors, stores and observers.

Plugins are modules of ``@hookimpl`` functions registered through the
``ledgerflow`` entry-point group (the built-ins use the same path). A hook
implementation declares only the arguments it needs. Hooks are called with
keyword arguments, in the driver process, never in a worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import click

    from .config import Settings
    from .executor import Executor
    from .store import RunStore

hookspec = pluggy.HookspecMarker("ledgerflow")
hookimpl = pluggy.HookimplMarker("ledgerflow")


@hookspec(historic=True)
def ledgerflow_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add new hook specifications (e.g. an embedder registry).

    Called once per plugin as it registers. Use
    ``pluginmanager.add_hookspecs(module)``.
    """


@hookspec
def ledgerflow_executor_names() -> list[str]:
    """Return the executor names this plugin can build (for listings and errors)."""
    raise NotImplementedError


@hookspec(firstresult=True)
def ledgerflow_make_executor(name: str, settings: Settings) -> Executor | None:
    """Build the executor called ``name``, or return None if it is not yours.

    Called once per run (and per resume) in the driver. Stops at the first
    non-None result.
    """
    raise NotImplementedError


@hookspec
def ledgerflow_store_names() -> list[str]:
    """Return the store names this plugin can build."""
    raise NotImplementedError


@hookspec(firstresult=True)
def ledgerflow_make_store(name: str, settings: Settings) -> RunStore | None:
    """Build the run store called ``name``, or return None if it is not yours.

    ``settings.store`` is the path (a file for ``duckdb``). Stops at the first
    non-None result.
    """
    raise NotImplementedError


@hookspec
def ledgerflow_run_start(run_id: str, pipeline: str, resumed: bool) -> None:
    """Called in the driver when a run (or a resume of it) starts driving."""


@hookspec
def ledgerflow_task_state_changed(run_id: str, task_key: str, old: str | None, new: str,
                                  attempt: int, reason: str) -> None:
    """Called in the driver after each task transition is recorded.

    Runs on the scheduler thread: keep it cheap. Exceptions are logged and
    never break the run.
    """


@hookspec
def ledgerflow_run_finish(run_id: str, state: str) -> None:
    """Called in the driver when a run stops driving (terminal or interrupted)."""


@hookspec
def ledgerflow_add_cli_commands(group: click.Group) -> None:
    """Add commands to the ``pipeline`` CLI group."""


