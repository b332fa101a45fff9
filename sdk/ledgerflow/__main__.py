"""``python -m ledgerflow`` is the ``pipeline`` command."""

from ledgerflow.cli import main

main()
