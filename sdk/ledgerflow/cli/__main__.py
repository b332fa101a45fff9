"""``python -m ledgerflow.cli`` is the ``pipeline`` command."""

from ledgerflow.cli import main

main()
