"""The plugin surface: every name it promises resolves, and the CLI loads only when asked."""

from __future__ import annotations

import subprocess
import sys

import ledgerflow.spi as spi


def test_every_promised_name_resolves() -> None:
    missing = [name for name in spi.__all__ if not hasattr(spi, name)]
    assert missing == []
    assert callable(spi.guard) and callable(spi.execute) and spi.hookimpl is not None


def test_importing_it_does_not_load_the_cli_renderer() -> None:
    code = "import sys, ledgerflow.spi; print('ledgerflow.cli.render' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "False"
