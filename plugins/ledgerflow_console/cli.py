"""The ``pipeline console`` command: check the options, bind, print the URL, serve; and
``pipeline console token``, which makes (or revokes) an approver's own console token."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import click

from ledgerflow.errors import InputError, PipelineError

TOKENS_HELP = ("Per-approver tokens file (name: sha256 lines, mode 0600): approve and reject "
               "with an approver's own token, as that approver [env LEDGERFLOW_APPROVER_TOKENS].")


def _report(fn: Callable[[], None]) -> None:
    """Run ``fn``; a ledgerflow error is an Error and a Hint line and its exit code."""
    debug = bool(click.get_current_context().find_root().params.get("debug"))
    try:
        fn()
    except PipelineError as exc:
        if debug:
            traceback.print_exception(exc)
        click.echo(f"Error: {exc}", err=True)
        if exc.hint:
            click.echo(f"Hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)


@click.group(invoke_without_command=True)
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
@click.option("--approver-tokens", "approver_tokens", envvar="LEDGERFLOW_APPROVER_TOKENS",
              metavar="FILE", type=click.Path(dir_okay=False, path_type=Path),
              help=TOKENS_HELP)
@click.option("--open", "open_browser", is_flag=True, help="Open the URL in a browser.")
@click.pass_context
def console(ctx: click.Context, store: str | None, host: str, port: int, allow_actions: bool,
            approver_tokens: Path | None, open_browser: bool) -> None:
    """Serve a local web console of the ledger: runs, timelines, logs, lineage.

    Read-only unless --allow-actions. Prints its URL first (with the token
    when actions are allowed); Ctrl-C stops it. With --approver-tokens, each
    approver decides with their own token (make one with: pipeline console
    token --for NAME).

    \b
    Example:
      pipeline console --store .ledgerflow/ledger.duckdb --port 8765 --open
    """
    if ctx.invoked_subcommand is not None:
        return

    def go() -> None:
        from .server import serve
        serve(store=store, host=host, port=port, allow_actions=allow_actions,
              approver_tokens=approver_tokens, open_browser=open_browser)
    _report(go)


@console.command("token")
@click.option("--for", "name", required=True, metavar="NAME",
              help="The approver's name, as the gates list it in approvers=[...].")
@click.option("--approver-tokens", "approver_tokens", envvar="LEDGERFLOW_APPROVER_TOKENS",
              metavar="FILE", type=click.Path(dir_okay=False, path_type=Path),
              help="The tokens file to add to (made with mode 0600 if missing) "
              "[env LEDGERFLOW_APPROVER_TOKENS].")
@click.option("--revoke", is_flag=True, help="Remove every token of NAME instead.")
def token(name: str, approver_tokens: Path | None, revoke: bool) -> None:
    """Make a fresh console token for approver NAME: printed once, stored only hashed.

    The token alone is printed on stdout; give it to NAME, who opens the
    console's URL with #approver=TOKEN at the end (or sends it as
    Authorization: Bearer TOKEN) and then approves and rejects as NAME.

    \b
    Example:
      pipeline console token --for alice --approver-tokens ~/.ledgerflow-tokens
    """
    def go() -> None:
        from ledgerflow.identity import add_token, revoke_tokens
        if approver_tokens is None:
            raise InputError("no approver tokens file given",
                             hint="pass --approver-tokens FILE or set "
                             "LEDGERFLOW_APPROVER_TOKENS")
        if revoke:
            gone = revoke_tokens(approver_tokens, name)
            click.echo(f"revoked {gone} token(s) of {name} in {approver_tokens}", err=True)
            return
        fresh = add_token(approver_tokens, name)
        click.echo(fresh)
        click.echo(f"token for {name} stored hashed in {approver_tokens} (shown only now); "
                   "open the console's URL with #approver=TOKEN at the end, or send it as "
                   "Authorization: Bearer TOKEN", err=True)
    _report(go)
