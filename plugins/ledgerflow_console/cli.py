"""The ``pipeline console`` command: check the options, bind, print the URL, serve."""

from __future__ import annotations

import sys
import traceback

import click

from ledgerflow.errors import PipelineError


@click.command()
@click.option("--store", envvar="LEDGERFLOW_STORE", metavar="PATH",
              help="Ledger file [env LEDGERFLOW_STORE; default .ledgerflow/ledger.duckdb].")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback lets others on the network read "
              "the ledger.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port to bind (0: a free one).")
@click.option("--allow-actions", is_flag=True,
              help="Offer cancel, resume, approve and reject (each needs the token printed "
              "in the URL).")
@click.option("--open", "open_browser", is_flag=True, help="Open the URL in a browser.")
def console(store: str | None, host: str, port: int, allow_actions: bool,
            open_browser: bool) -> None:
    """Serve a local web console of the ledger: runs, timelines, logs, lineage.

    Read-only unless --allow-actions. Prints its URL first (with the token
    when actions are allowed); Ctrl-C stops it.

    \b
    Example:
      pipeline console --store .ledgerflow/ledger.duckdb --port 8765 --open
    """
    debug = bool(click.get_current_context().find_root().params.get("debug"))
    try:
        from .server import serve
        serve(store=store, host=host, port=port, allow_actions=allow_actions,
              open_browser=open_browser)
    except PipelineError as exc:
        if debug:
            traceback.print_exception(exc)
        click.echo(f"Error: {exc}", err=True)
        if exc.hint:
            click.echo(f"Hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
