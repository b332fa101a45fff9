"""The commands about the ledger itself: ``plugins``, ``fold``, ``doctor``, ``repair``."""

from __future__ import annotations

import sys

from .. import control as api
from .guard import guard
from .options import JSON, STORE, main
from .render import dumps, out


@main.command()
@guard
def plugins() -> None:
    """List registered plugins and what they provide.

    \b
    Example:
      pipeline plugins
    """
    from ..plugins import plugin_table
    for name, where, provides in plugin_table():
        out(f"{name:<16} {', '.join(provides) or '-':<32} {where}")


@main.command()
@STORE
@guard
def fold(store: str | None) -> None:
    """Fold the journals that stopped drivers left into the ledger's tables now.

    Any command that writes (run, resume, cancel, repair) does it too; use this
    to bring the tables current for SQL users.

    \b
    Example:
      pipeline fold --store .ledgerflow/ledger.duckdb
    """
    done = api.fold(store=store)
    out(f"folded {len(done)} run(s)" + (": " + ", ".join(done) if done else ""))


@main.command()
@STORE
@JSON
@guard
def doctor(store: str | None, as_json: bool) -> None:
    """Check a ledger (file, journals, folds, leases, result files) in plain words.

    Exit 0 when nothing is wrong, 2 when something is (with the fix).

    \b
    Example:
      pipeline doctor --store .ledgerflow/ledger.duckdb
    """
    found = api.doctor(store=store)
    problems = [f for f in found if f["problem"]]
    if as_json:
        out(dumps(found))
    else:
        for f in found:
            out(("PROBLEM " if f["problem"] else "ok      ") + f["what"])
            if f["fix"]:
                out(f"        fix: {f['fix']}")
        out(f"{len(problems)} problem(s) found" if problems else "no problems found")
    if problems:
        sys.exit(2)


@main.command()
@STORE
@guard
def repair(store: str | None) -> None:
    """Rebuild the ledger's tables from its journals into a new file and swap it in.

    The old file is kept beside it (LEDGER.broken-TIME). Refused while a run is
    being driven.

    \b
    Example:
      pipeline repair --store .ledgerflow/ledger.duckdb
    """
    kept, notes = api.repair(store=store)
    if kept:
        out(f"rebuilt the tables from the journals; the old file is kept at {kept}")
    for note in notes:
        out(f"  {note}")
    out("next: pipeline doctor  |  pipeline runs")
