"""Who may act through the console: actions on or off, same-origin only, and whose token.

Two kinds of token open the actions (``--allow-actions``):

* the console's **action token**, made per process and printed in its URL
  (sent as ``X-Ledgerflow-Token`` or ``?token=``): every action; a decision
  made with it is the console's OS user's (or an ``as`` name the approvers
  mapping allows that user, :func:`ledgerflow.identity.decider`);
* a **per-approver token** from the tokens file (``--approver-tokens FILE``,
  :func:`ledgerflow.identity.from_token`), sent as ``Authorization: Bearer
  TOKEN`` (or ``X-Ledgerflow-Token``): approve and reject only, decided as that
  approver; a gate that lists approvers refuses the others with 403.

Tokens are compared in constant time (the action token with
:func:`hmac.compare_digest`, approver tokens by their SHA-256) and are never
written into a page, a log line or the ledger: the page keeps an approver's
token in the browser (read from the URL's ``#approver=`` fragment, which is
never sent to the server) and sends it in a header.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from pathlib import Path

from ledgerflow.errors import InputError, PipelineError
from ledgerflow.identity import Verified, from_token

__all__ = ["Forbidden", "bearer", "caller", "who"]

TOKEN_HEADER = "x-ledgerflow-token"


class Forbidden(PipelineError):
    """The request may not do this (answered with 403, nothing is recorded)."""


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, if there is one."""
    raw = headers.get("authorization")
    if raw is None:
        return None
    scheme, _, value = raw.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _is(token: str | None, action_token: str) -> bool:
    return bool(action_token) and token is not None and hmac.compare_digest(
        token.encode(), action_token.encode())


def _approver(token: str, tokens: Path | None) -> Verified:
    if tokens is None:
        raise Forbidden("this console has no approver tokens",
                        hint="start it with --approver-tokens FILE, or use the URL with "
                        "?token= that the console printed")
    try:
        name = from_token(token, tokens)
    except InputError as exc:       # the file became unsafe or went away since the start
        raise Forbidden(str(exc), hint=exc.hint) from None
    if name is None:
        raise Forbidden("unknown approver token",
                        hint="ask the console's operator for a new one (pipeline console "
                        "token --for NAME), or use the URL the console printed")
    return name


def who(headers: Mapping[str, str], query_token: str | None, *, action_token: str,
        tokens: Path | None) -> tuple[str, Verified | None]:
    """Which token the request carries: ``("approver", name)``, ``("action", None)`` or
    ``("", None)`` (none). A Bearer token is an approver's; an
    ``X-Ledgerflow-Token`` that is not the action token may be one too.

    Raises:
        Forbidden: a token that is neither (an unknown or revoked approver token).
    """
    given = bearer(headers)
    header = headers.get(TOKEN_HEADER)
    if given is not None:
        return "approver", _approver(given, tokens)
    if _is(header, action_token) or (header is None and _is(query_token, action_token)):
        return "action", None
    if header and tokens is not None:
        return "approver", _approver(header, tokens)
    return "", None


def caller(headers: Mapping[str, str], query_token: str | None, *, allow_actions: bool,
           action_token: str, tokens: Path | None, allowed_hosts: frozenset[str],
           decides: bool) -> Verified | None:
    """Check that the request may act; return the approver it decides as (None: the
    console's own user, with the action token).

    ``decides``: approve or reject (an approver token is enough); anything else
    needs the action token.

    Raises:
        Forbidden: read-only console, a cross-site request, no or a wrong token, or
            an approver token for anything but a decision.
    """
    if not allow_actions:
        raise Forbidden("this console is read-only",
                        hint="start it with: pipeline console --allow-actions")
    origin = headers.get("origin")
    if origin is not None and origin.split("://", 1)[-1].lower() not in allowed_hosts:
        raise Forbidden(f"cross-site request from {origin} refused",
                        hint="use the console's own page")
    if headers.get("sec-fetch-site") == "cross-site":
        raise Forbidden("cross-site request refused", hint="use the console's own page")
    if not decides:
        if _is(headers.get(TOKEN_HEADER), action_token) or _is(query_token, action_token):
            return None
        if bearer(headers) is not None:
            raise Forbidden("an approver token decides approvals only",
                            hint="cancel, resume and start need the console's action token "
                            "(in the URL the console printed)")
    else:
        kind, name = who(headers, query_token, action_token=action_token, tokens=tokens)
        if kind:
            return name
    raise Forbidden("missing or wrong console token",
                    hint="use the URL with ?token= that the console printed, or send your "
                    "approver token as: Authorization: Bearer TOKEN")
