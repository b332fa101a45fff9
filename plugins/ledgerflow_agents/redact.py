"""Known secret values taken out of what a call records or shows the model.

A tool's exception text, a tool's result, a provider's error message or a
recorded prompt may quote an API key (``AuthError: bad key sk-live-...``).
Whatever the task's ``record_content``, such text reaches the ledger (the
``tool_calls.error`` column, the step record, a notice) and the model (the
error is the next message). :func:`redact` replaces every **known** secret
value with ``[redacted NAME]`` first. Known means: the value of the call's
key alias, and of every environment variable whose name says it holds one
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
