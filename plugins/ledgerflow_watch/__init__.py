"""The ``watch`` plugin: ``pipeline watch``, runs started by file changes and schedules.

Registered as ``watch = "ledgerflow_watch"`` in the ``ledgerflow`` entry-point
group; needs ``pip install 'ledgerflow[watch]'`` (watchfiles for file events,
croniter for ``--cron``, imported only when the command runs). Modules:
:mod:`.watcher` (the loop, what is watched, the trigger on each run),
:mod:`.schedule` (``--every`` / ``--cron`` and the missed-slot policy),
:mod:`.cli` (the command). ``python -m ledgerflow_watch`` is the command alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledgerflow import hookimpl

if TYPE_CHECKING:
    import click


@hookimpl
def ledgerflow_add_cli_commands(group: click.Group) -> None:
    from .cli import watch
    group.add_command(watch)
