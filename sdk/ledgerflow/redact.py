"""Known secret values taken out of the text an attempt leaves in the ledger.

A task's exception text, what it prints, a tool's result, a provider's error
message or a recorded prompt may quote an API key (``AuthError: bad key
sk-live-...``). Such text reaches the ledger (an attempt's error and traceback,
its captured output, the ``tool_calls.error`` column, a step record, a notice)
and, from an agent's tools, the model (the error is the next message). The
executor and the agents plugin pass it through :func:`redact`, which replaces
every **known** secret value with ``[redacted NAME]`` first. Known means: the
value of a call's key alias, and of every environment variable whose name says it holds one
(``*KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*PASSWD*``,
``*CREDENTIAL*``), at least 8 characters long. An unknown secret (one typed
into a prompt) cannot be recognised and is not hidden.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

__all__ = ["known_secrets", "redact"]

#: Environment variable names whose values are treated as secrets.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL", re.IGNORECASE)
#: Shorter values are not replaced (they would match ordinary words).
MIN_LENGTH = 8


def known_secrets(aliases: Iterable[str | None] = ()) -> list[tuple[str, str]]:
    """``(name, value)`` of every known secret, the longest value first."""
    env = os.environ
    names = {a for a in aliases if a} | {n for n in env if SECRET_NAME.search(n)}
    found = {(n, env[n]) for n in names if len(env.get(n) or "") >= MIN_LENGTH}
    return sorted(found, key=lambda nv: (-len(nv[1]), nv[0]))


def redact(text: str, aliases: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret value replaced by ``[redacted NAME]``.

    Example:
        >>> os.environ["DOCTEST_API_KEY"] = "sk-0123456789"
        >>> redact("401: key sk-0123456789 refused")
        '401: key [redacted DOCTEST_API_KEY] refused'
        >>> del os.environ["DOCTEST_API_KEY"]
    """
    if not text:
        return text
    for name, value in known_secrets(aliases):
        if value in text:
            text = text.replace(value, f"[redacted {name}]")
    return text
