"""Run a README command as a user would: the installed ``pipeline`` script, in a real subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import PIPELINE_EXE, ROOT

RUN_ID = re.compile(r"\b(\d{8}-\d{6}-[0-9a-f]{6})\b")


def env() -> dict[str, str]:
    """The user's environment without ledger settings, offline for the models."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERFLOW_")}
    out.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    return out


def run(argv: list[str], cwd: Path, *, timeout: float = 900, extra: dict[str, str] | None = None,
        **subs: str) -> subprocess.CompletedProcess[str]:
    """Run one README command: ``pipeline`` is the installed script, ``recipes/...`` the repo's
    recipes, and each ``NAME=value`` of ``subs`` replaces NAME in the words (RUN_ID, DIGEST);
    ``extra`` adds environment variables."""
    words = [PIPELINE_EXE if w == "pipeline" else w for w in argv]
    words = [str(ROOT / w) if w.startswith("recipes/") else w for w in words]
    for name, value in subs.items():
        words = [w.replace(name, value) for w in words]
    return subprocess.run(words, cwd=cwd, env={**env(), **(extra or {})}, capture_output=True,
                          text=True, timeout=timeout)


def run_id(out: str) -> str:
    """The first run id in a command's output."""
    m = RUN_ID.search(out)
    assert m, out
    return m.group(1)


def json_of(argv: list[str], cwd: Path, **subs: str) -> Any:
    """A command's ``--json`` document (the command must succeed)."""
    res = run([*argv, "--json"] if "--json" not in argv else argv, cwd, **subs)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


def usage(section_text: str, command: str) -> list[str]:
    """An inline ``pipeline COMMAND ...`` usage of a section's prose as words, optional
    ``[...]`` groups kept as their words (``[--as NAME]`` -> ``--as NAME``)."""
    spans = re.findall(r"`(pipeline [^`]+)`", re.sub(r"\s*\n\s*", " ", section_text))
    for span in spans:
        words = span.replace("[", "").replace("]", "").split()
        if words[1] == command:
            return words
    raise LookupError(f"no `pipeline {command} ...` in the section")


def local_model() -> bool:
    """Whether the local model (SmolLM2 through the local-model extra) is installed."""
    try:
        from ledgerflow_agents.local import available
    except ImportError:
        return False
    return available()
