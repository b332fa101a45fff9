"""Secrets kept off what the console shows: store-URL passwords masked in every text it sends.

The store the console reads may be a ``postgresql://user:PASSWORD@host/db``
URL (or a libpq string with ``password=...``). Reads need no token, so the
password must never reach a page header, an error page, an action's reply or
a child process's command line. :func:`mask` hides any URL password in a
text; :class:`Redactor` also hides the console's own store password wherever
it appears (raw or percent-decoded), e.g. inside a driver's error message.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["MASK", "RedactBodies", "Redactor", "mask"]

MASK = "***"

# scheme://user:PASSWORD@ : the password is whatever lies between the first ':' after
# the user name and the last '@' before the host (passwords may hold '@' or '/')
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^\s]*@(?=[^@\s]*$|"
                           r"[^@\s]*[\s])", re.IGNORECASE)
_URL_PASSWORD_SIMPLE = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s/]*@",
                                  re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s&;]+)",
                               re.IGNORECASE)


def mask(text: str) -> str:
    """``text`` with every URL password and ``password=...`` value replaced by ``***``.

    Example:
        >>> mask("postgresql://ana:s3cret@db:5432/ledger?password=x")
        'postgresql://ana:***@db:5432/ledger?password=***'
    """
    text = _URL_PASSWORD_SIMPLE.sub(lambda m: f"{m['head']}{MASK}@", text)
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _KEYWORD_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)


def _passwords(store: str | None) -> list[str]:
    """The passwords ``store`` holds (URL userinfo and ``password=`` parameters)."""
    if not store:
        return []
    found: list[str] = []
    try:
        parts = urlsplit(store)
        if parts.password:
            found.append(parts.password)
    except ValueError:
        pass
    for m in re.finditer(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&;]+)", store,
                         re.IGNORECASE):
        found.append(m.group(1).strip("'"))
    out: list[str] = []
    for pw in found:
        for form in (pw, unquote(pw)):
            if len(form) >= 3 and form not in out:
                out.append(form)
    return sorted(out, key=len, reverse=True)


class Redactor:
    """Hide the store's password (and any URL password) in texts the console sends.

    Args:
        store: the store location the console was started with.
    """

    def __init__(self, store: str | None) -> None:
        self.secrets = _passwords(store)

    def __call__(self, text: str | None) -> str:
        """``text`` without the store's password or any URL password."""
        if not text:
            return text or ""
        text = mask(text)
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text


class RedactBodies:
    """Take the store's password out of every answer (pages, JSON, errors, replies).

    Only when the store location holds one (a ``postgresql://user:pw@`` URL):
    a task's error text, a driver's message or an action's reply may quote it,
    and reads need no token. Bodies sent in one piece (all of the console's)
    are rewritten and their ``content-length`` fixed.
    """

    def __init__(self, app: ASGIApp, redact: Redactor) -> None:
        self.app = app
        self.redact = redact

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.redact.secrets:
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] | None = None

        async def rewrite(message: dict[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] == "http.response.body" and start is not None:
                head, start = start, None
                if message.get("more_body"):        # streamed: sent as it comes
                    await send(head)
                    await send(message)
                    return
                body = self.redact(message.get("body", b"").decode("utf-8", "replace")
                                   ).encode()
                head = {**head, "headers": [(k, v) for k, v in head.get("headers", [])
                                            if k.lower() != b"content-length"]
                        + [(b"content-length", str(len(body)).encode())]}
                await send(head)
                await send({**message, "body": body})
                return
            await send(message)

        await self.app(scope, receive, rewrite)  # type: ignore[arg-type]
