"""Built-in run stores: ``duckdb`` (the default ledger) and ``memory`` (tests)."""
