"""The README's *CLI* synopsis against the installed commands: every command it lists exists
and takes every option it shows (so the synopsis cannot drift from ``pipeline --help``)."""

from __future__ import annotations

import re

import click
import pytest

from ledgerflow.cli import main

from .readme import blocks


def _synopsis() -> list[tuple[list[str], list[str]]]:
    """(command names, options) per command of the synopsis; ``a | b`` lines name several."""
    (block,) = blocks("CLI", "")
    entries: list[tuple[list[str], list[str]]] = []
    for line in block.splitlines():
        if line.startswith("pipeline "):
            entries.append(([], []))
        elif not line.strip() or not entries:
            continue
        code = line.split("#", 1)[0]
        if line.startswith("pipeline "):
            names = [code.split()[1], *re.findall(r"\s\|\s+([a-z-]+)", code)]
            entries[-1][0].extend(names)
        entries[-1][1].extend(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", code))
    return entries


SYNOPSIS = _synopsis()


@pytest.mark.parametrize("names, options", SYNOPSIS, ids=[" ".join(n) for n, _ in SYNOPSIS])
def test_each_listed_command_takes_the_options_shown(names: list[str],
                                                     options: list[str]) -> None:
    ctx = click.Context(main)
    known: set[str] = set()
    for name in names:
        command = main.get_command(ctx, name)
        assert command is not None, f"pipeline {name} is in the README but not installed"
        known.update(opt for param in command.params for opt in param.opts)
    missing = sorted(set(options) - known)
    assert not missing, f"pipeline {' | '.join(names)}: the README shows {missing}"


def test_the_synopsis_lists_the_core_commands() -> None:
    listed = {name for names, _ in SYNOPSIS for name in names}
    assert {"run", "resume", "status", "approve", "console", "validate", "draft",
            "worker"} <= listed
