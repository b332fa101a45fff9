"""The ``console`` plugin: ``pipeline console``, a local web page over the ledger.

Registered as ``console = "ledgerflow_console"`` in the ``ledgerflow``
entry-point group; the web server needs ``pip install 'ledgerflow[console]'``
(starlette and uvicorn, imported only when the command runs). See
``README.md`` here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledgerflow import hookimpl

if TYPE_CHECKING:
    import click


@hookimpl
def ledgerflow_add_cli_commands(group: click.Group) -> None:
    from .cli import console
    group.add_command(console)
