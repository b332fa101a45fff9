"""``python -m ledgerflow_watch TARGET ...`` is ``pipeline watch TARGET ...``."""

from .cli import watch

watch(prog_name="pipeline watch")
