"""Start the console: check the ledger, bind the socket, print the URL, run uvicorn.

The socket is bound before uvicorn starts, so ``--port 0`` prints the port
actually taken and the Host check knows it.
"""

from __future__ import annotations

import gc
import secrets
import socket
import sys
import threading
import webbrowser
from pathlib import Path

from ledgerflow.errors import InputError, PluginError

from .ledger import Ledger
from .redact import mask


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         hint="pass --port 0 for a free port, or another --host") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(*, store: str | None, host: str, port: int, allow_actions: bool,
          open_browser: bool, approver_tokens: Path | None = None) -> None:
    """Serve the console until interrupted (see :mod:`ledgerflow_console.cli`)."""
    try:
        import uvicorn

        from .app import ConsoleConfig, allowed_hosts, create_app
    except ImportError as exc:
        raise PluginError(f"the console needs starlette and uvicorn ({exc.name} is missing)",
                          hint="pip install 'ledgerflow[console]'") from None
    names = _approvers(approver_tokens) if allow_actions else []
    ledger = Ledger(store)
    ledger.runs(limit=1)       # a damaged or unreadable ledger: Error/Hint now, not per page
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    label = mask(store or _default_label())        # never a password on screen
    token = secrets.token_urlsafe(18) if allow_actions else ""
    cfg = ConsoleConfig(store=store, store_label=label, host=host, port=bound,
                        allow_actions=allow_actions, token=token,
                        approver_tokens=approver_tokens if allow_actions else None,
                        allowed_hosts=allowed_hosts(host, bound))
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/" + (f"?token={token}" if token else "")
    print(f"console: {url}", flush=True)
    print(f"ledger {label}; " + ("actions enabled (cancel, resume, approve, reject) with the "
                                 "token in the URL" if allow_actions else "read-only")
          + "; Ctrl-C stops", flush=True)
    if approver_tokens is not None:
        print(f"approver tokens: {', '.join(names) or 'none yet'} decide as themselves "
              f"({approver_tokens})" if allow_actions else
              "approver tokens unused: the console is read-only", flush=True)
    # a long-lived reader: objects of one request die with it, so collect less often
    gc.set_threshold(50_000, 20, 20)
    config = uvicorn.Config(create_app(cfg), log_level="warning", access_log=False,
                            proxy_headers=False, server_header=False, lifespan="off",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    if open_browser:
        threading.Timer(0.3, webbrowser.open, args=(url,)).start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:   # uvicorn re-raises the Ctrl-C it handled: stopping is the way out
        pass
    finally:
        sock.close()
    sys.stdout.flush()


def _approvers(path: Path | None) -> list[str]:
    """The approvers with a token in ``path`` (checked now: a file others may read is an
    Error with its fix before anything is served)."""
    if path is None:
        return []
    from ledgerflow.identity import check_tokens_file, token_names
    return token_names(check_tokens_file(path))


def _default_label() -> str:
    from ledgerflow.config import Settings
    return Settings.from_env().store
