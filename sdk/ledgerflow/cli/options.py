"""The ``pipeline`` group: its shared options, and commands found by name when asked.

The core commands live in one module per family (:mod:`.drive`,
:mod:`.inspect`, :mod:`.approvals`, :mod:`.ledger`); plugins add theirs
through the ``ledgerflow_add_cli_commands`` hook, which is called only when
a command the core does not have is asked for (or for ``--help``), so
``pipeline status`` imports no plugin's command line.
"""

from __future__ import annotations

import click

from ..errors import PluginError
from .render import out

STORE = click.option("--store", envvar="LEDGERFLOW_STORE", metavar="PATH|URL",
                     help="Ledger file, or a postgresql:// URL [env LEDGERFLOW_STORE; "
                     "default .ledgerflow/ledger.duckdb].")
JSON = click.option("--json", "as_json", is_flag=True, envvar="LEDGERFLOW_JSON",
                    help="Print JSON instead of a table [env LEDGERFLOW_JSON].")
EXECUTOR = click.option("--executor", envvar="LEDGERFLOW_EXECUTOR", metavar="NAME",
                        help="An executor plugin: inline, threads (default), processes, "
                        "mock, dask... (pipeline plugins lists them) [env LEDGERFLOW_EXECUTOR].")
WORKERS = click.option("--workers", envvar="LEDGERFLOW_WORKERS", type=click.IntRange(1),
                       help="Tasks run at once [env LEDGERFLOW_WORKERS; default 4].")
LOGS = click.option("--logs", is_flag=True, envvar="LEDGERFLOW_LOGS",
                    help="Echo what tasks print and log to stderr, prefixed with the task key "
                    "(always kept per attempt: pipeline logs) [env LEDGERFLOW_LOGS].")
WAIT = click.option("--wait-approvals", is_flag=True, envvar="LEDGERFLOW_WAIT_APPROVALS",
                    help="Keep driving while approvals are pending (else the run stops "
                    "'waiting', exit code 3) [env LEDGERFLOW_WAIT_APPROVALS].")
DASK = click.option("--dask-address", envvar="LEDGERFLOW_DASK_ADDRESS", metavar="URL",
                    help="Dask scheduler, e.g. tcp://127.0.0.1:8786 [env LEDGERFLOW_DASK_ADDRESS].")
PARAMS = click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
                      help="A pipeline parameter, converted by its type annotation.")


class PipelineGroup(click.Group):
    """The command group; plugin commands are added the first time one is needed."""

    _plugins_loaded = False

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        try:
            from ..plugins import get_plugin_manager
            get_plugin_manager().hook.ledgerflow_add_cli_commands(group=self)
        except PluginError as exc:   # a broken plugin must not hide the core commands
            out(f"Warning: plugin commands not loaded: {exc}", err=True)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_plugins()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None:       # a core command: no plugin is imported for it
            return found
        self._load_plugins()
        return super().get_command(ctx, cmd_name)


@click.group(cls=PipelineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="LEDGERFLOW_DEBUG",
              help="Show tracebacks for errors (also accepted after the command).")
@click.version_option(package_name="ledgerflow")
def main(debug: bool) -> None:
    """Run, inspect, cancel and resume ledgerflow pipelines.

    \b
    Example:
      pipeline run flows.py -p n=10
      pipeline status RUN_ID
      pipeline resume RUN_ID
    """
