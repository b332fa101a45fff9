"""The ``pipeline`` command in a real subprocess, for tests that run it as a user would."""

from __future__ import annotations

import subprocess
import sys


def pipeline_cli(*args: str, env: dict[str, str],
                 timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` (as ``python -m ledgerflow``) with ``env``; output captured."""
    return subprocess.run([sys.executable, "-m", "ledgerflow", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)
