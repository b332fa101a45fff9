"""Known secret values out of what an agent's calls record: :mod:`ledgerflow.redact`.

The redaction lives in the core (an attempt's own error and output go through it
too); this name stays for the agents plugin's modules and its users.
"""

from __future__ import annotations

from ledgerflow.redact import MIN_LENGTH, SECRET_NAME, known_secrets, redact

__all__ = ["MIN_LENGTH", "SECRET_NAME", "known_secrets", "redact"]
