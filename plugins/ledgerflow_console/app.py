"""The console's web application: routes, the Host and token checks, error answers.

Pages are HTML (``/``, ``/runs/{id}`` and the fragments they load); every
page has a JSON twin under ``/api/``; ``/metrics`` is the Prometheus text
that drivers wrote for this ledger (:mod:`ledgerflow_observability.prometheus`). Reads are open to anyone who can reach
the bound address with the right Host header; actions (``POST``) also need
``--allow-actions`` and the per-process token in ``X-Ledgerflow-Token``
(or ``?token=``), or, to approve and reject, an approver's own token
(:mod:`.access`). Any other Host header (a DNS-rebinding page) or a
cross-site ``Origin`` gets 403. A password in the store URL is taken out of
every answer (:class:`~.redact.RedactBodies`).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ledgerflow.errors import (
    InputError,
    NotResumableError,
    PipelineError,
    RunNotFoundError,
    StoreLockedError,
    TaskNotFoundError,
)

from . import access, actions, graphs, pages, views
from . import calls as agent_calls
from .ledger import Ledger
from .redact import RedactBodies, Redactor, mask

log = logging.getLogger("ledgerflow.console")

TOKEN_HEADER = access.TOKEN_HEADER
TERMINAL_RUN_STATES = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(slots=True, kw_only=True)
class ConsoleConfig:
    """How one console process serves: its ledger, address, token and whether it acts."""

    store: str | None
    store_label: str
    host: str
    port: int
    allow_actions: bool = False
    token: str = ""
    approver_tokens: Path | None = None     # the per-approver tokens file, if any
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)


def allowed_hosts(host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host header values a browser sends for this console (``127.0.0.1:8765``...)."""
    import socket
    names = {host, *extra}
    if host in ("127.0.0.1", "localhost", "::1"):
        names |= {"127.0.0.1", "localhost", "::1"}
    if host in ("0.0.0.0", "::"):
        names |= {"127.0.0.1", "localhost", "::1", socket.gethostname(), socket.getfqdn()}
    out = set()
    for n in names:
        n = f"[{n}]" if ":" in n and not n.startswith("[") else n
        out.add(f"{n}:{port}".lower())
        if port == 80:
            out.add(n.lower())
    return frozenset(out)


class HostGuard:
    """Answer 403 to any request whose Host header is not this console's address."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = b""
            for k, v in scope["headers"]:
                if k == b"host":
                    host = v
                    break
            if host.decode("latin-1").lower() not in self.allowed:
                resp = JSONResponse({"error": "Host header not allowed for this console",
                                     "hint": "open the URL the console printed"},
                                    status_code=403)
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


def status_of(exc: PipelineError) -> int:
    """The HTTP status for a ledgerflow error."""
    if isinstance(exc, actions.ActionUnsupported):
        return 501
    if isinstance(exc, access.Forbidden):
        return 403
    if isinstance(exc, RunNotFoundError):
        return 404
    if isinstance(exc, NotResumableError):
        return 409
    if isinstance(exc, StoreLockedError):
        return 503
    if isinstance(exc, InputError):
        return 400
    return 500 if exc.exit_code == 70 else 409


def create_app(cfg: ConsoleConfig) -> ASGIApp:
    """Build the console's ASGI application for ``cfg``."""
    ledger = Ledger(cfg.store)
    usage_cache: dict[str, Any] = {}

    def ctx(request: Request) -> pages.Ctx:
        tok = request.query_params.get("token")
        good = bool(cfg.token) and tok is not None and hmac.compare_digest(tok, cfg.token)
        return pages.Ctx(store=mask(cfg.store_label), actions=cfg.allow_actions,
                         token=tok if good else None, has_logs=ledger.has("logs"),
                         has_approvals=ledger.has("approvals"), has_usage=ledger.has("usage"))

    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/api/")

    def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PipelineError)
        code = status_of(exc)
        if wants_json(request):
            return JSONResponse({"error": str(exc), "hint": exc.hint}, status_code=code)
        return HTMLResponse(pages.error_page(ctx(request), code, str(exc), exc.hint),
                            status_code=code)

    def on_bug(request: Request, exc: Exception) -> Response:
        log.exception("console: internal error on %s", request.url.path, exc_info=exc)
        msg = f"internal error: {type(exc).__name__}: {exc}"
        hint = "this is a bug in the ledgerflow console; please report it"
        if wants_json(request):
            return JSONResponse({"error": msg, "hint": hint}, status_code=500)
        return HTMLResponse(pages.error_page(ctx(request), 500, msg, hint), status_code=500)

    def q_int(request: Request, name: str, default: int | None) -> int | None:
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise InputError(f"{name} must be a whole number, given: {raw!r}",
                             hint=f"pass ?{name}=10") from None

    def q_str(request: Request, name: str) -> str | None:
        return request.query_params.get(name) or None

    def need_task(request: Request) -> str:
        key = q_str(request, "task")
        if key is None:
            raise InputError("this needs a task key", hint="pass ?task=KEY")
        return key

    def html(body: str) -> HTMLResponse:
        return HTMLResponse(body, headers={"Cache-Control": "no-store"})

    def unsupported(what: str) -> JSONResponse:
        return JSONResponse({"error": f"this ledgerflow has no {what} yet",
                             "hint": "upgrade ledgerflow; the console shows them once it does"},
                            status_code=501)

    # -- models --------------------------------------------------------------------------
    def runs_model(request: Request) -> dict[str, Any]:
        limit = q_int(request, "limit", 100) or 100
        views_ = ledger.runs(limit=max(1, min(limit, 1000)))
        state, pipe = q_str(request, "state"), q_str(request, "pipeline")
        extras: dict[str, dict[str, Any]] = {}
        if ledger.has("approvals") or ledger.has("usage"):
            for v in views_:
                if (state and v.state != state) or (pipe and v.pipeline != pipe):
                    continue
                extras[v.run_id] = run_extras(v.run_id, v.state)
        return views.runs_page(views_, state=state, pipeline=pipe, extras=extras)

    def run_extras(run_id: str, state: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            run = None
            if ledger.has("approvals") and state not in TERMINAL_RUN_STATES:
                run = ledger.run(run_id)
                found = ledger.approvals(run) or []
                out["pending_approvals"] = sum(1 for a in found
                                               if a.get("state") in (None, "pending"))
            if ledger.has("usage"):
                if run_id in usage_cache:
                    out["usage"] = usage_cache[run_id]
                else:
                    run = run or ledger.run(run_id)
                    out["usage"] = views.usage_totals(ledger.usage(run))
                    if state in TERMINAL_RUN_STATES:
                        usage_cache[run_id] = out["usage"]
        except PipelineError as exc:       # one unreadable run must not hide the list
            out["error"] = str(exc)
        return out

    def run_model(run_id: str, *, notices: bool = True) -> dict[str, Any]:
        now = time.time()
        run = ledger.run(run_id)
        view = ledger.view(run)
        attempts = ledger.attempts(run)
        model: dict[str, Any] = {
            "header": views.run_header(view, now), "root_cause": views.root_cause(view),
            "groups": views.groups(view, now),
            "timeline": views.timeline(view, attempts, now=now)}
        if ledger.has("approvals"):
            model["approvals"] = ledger.approvals(run)
        if notices:
            model["notices"] = ledger.notices(run)
            if ledger.has("usage"):
                model["has_calls"] = agent_calls.has_calls(ledger.usage(run))
        return model

    # -- HTML pages and fragments --------------------------------------------------------
    def runs_page(request: Request) -> Response:
        model = runs_model(request)
        c = ctx(request)
        q = {k: v for k, v in request.query_params.items() if k not in ("token", "part") and v}
        src = "/?" + urlencode({"part": "live", **q})
        if request.query_params.get("part") == "live":
            return html(pages.runs_table(c, model, src))
        if cfg.allow_actions:
            model["targets"] = list(actions.known_targets(ledger))
        return html(pages.runs_page(c, model, src))

    def run_page(request: Request) -> Response:
        rid = request.path_params["run_id"]
        c = ctx(request)
        src = pages.run_path(rid, "?part=live")
        if request.query_params.get("part") == "live":
            return html(pages.run_live(c, run_model(rid, notices=False), src))
        return html(pages.run_page(c, run_model(rid), src))

    def items_fragment(request: Request) -> Response:
        rid = request.path_params["run_id"]
        return html(pages.items_html(ctx(request), rid, items_model(request)))

    def items_model(request: Request) -> dict[str, Any]:
        rid = request.path_params["run_id"]
        view = ledger.view(ledger.run(rid))
        return views.items(view, task=q_str(request, "task"), state=q_str(request, "state"),
                           offset=q_int(request, "offset", 0) or 0,
                           limit=q_int(request, "limit", views.ITEMS_PAGE) or views.ITEMS_PAGE)

    def inspect_fragment(request: Request) -> Response:
        rid = request.path_params["run_id"]
        key = need_task(request)
        attempt = q_int(request, "attempt", None)
        run = ledger.run(rid)
        tasks = ledger.view(run).tasks
        row = tasks.get(key)
        if row is None:
            raise TaskNotFoundError(rid, key, tasks)
        attempts = ledger.attempts(run, key)
        if attempt is None and attempts:
            attempt = max(int(a["attempt"]) for a in attempts)
        logs = ledger.logs(run, key, attempt) if ledger.has("logs") else None
        return html(pages.inspector_html(ctx(request), rid, key, attempt,
                                         views.task_item(row, time.time()), attempts, logs))

    def lineage_fragment(request: Request) -> Response:
        rid = request.path_params["run_id"]
        rows = ledger.lineage(ledger.run(rid), need_task(request))
        return html(pages.lineage_html(rows))

    def graph_svg(request: Request) -> Response:
        rid = request.path_params["run_id"]
        model = graphs.graph(ledger.view(ledger.run(rid), upstream=True))
        return html(pages.graph_svg(model, rid))

    def usage_fragment(request: Request) -> Response:
        run = ledger.run(request.path_params["run_id"])
        usage = ledger.usage(run)
        return html(pages.usage_html(usage, views.usage_totals(usage),
                                     agent_calls.calls(*ledger.calls(run))))

    def api_calls(request: Request) -> Response:
        run = ledger.run(request.path_params["run_id"])
        rows = agent_calls.calls(*ledger.calls(run))
        task = q_str(request, "task")
        return _json_default([r for r in rows if task is None or r["task_key"] == task])

    # -- JSON ----------------------------------------------------------------------------
    def api_runs(request: Request) -> Response:
        return JSONResponse(runs_model(request)["runs"])

    def api_status(request: Request) -> Response:
        from ledgerflow.cli.render import run_json  # exactly ``pipeline status --json``
        run = ledger.run(request.path_params["run_id"])
        return JSONResponse(run_json(ledger.view(run)))

    def api_page(request: Request) -> Response:
        return JSONResponse(run_model(request.path_params["run_id"]))

    def api_tasks(request: Request) -> Response:
        return JSONResponse(items_model(request))

    def api_groups(request: Request) -> Response:
        view = ledger.view(ledger.run(request.path_params["run_id"]))
        return JSONResponse(views.groups(view))

    def api_timeline(request: Request) -> Response:
        run = ledger.run(request.path_params["run_id"])
        rows = q_int(request, "rows", views.TIMELINE_ROWS) or views.TIMELINE_ROWS
        view = ledger.view(run)
        return JSONResponse(views.timeline(view, ledger.attempts(run), rows=max(1, rows)))

    def api_attempts(request: Request) -> Response:
        run = ledger.run(request.path_params["run_id"])
        return JSONResponse(ledger.attempts(run, q_str(request, "task")))

    def api_lineage(request: Request) -> Response:
        run = ledger.run(request.path_params["run_id"])
        return _json_default(ledger.lineage(run, q_str(request, "task")))

    def api_notices(request: Request) -> Response:
        return JSONResponse(ledger.notices(ledger.run(request.path_params["run_id"])))

    def api_graph(request: Request) -> Response:
        run = ledger.run(request.path_params["run_id"])
        return JSONResponse(graphs.graph(ledger.view(run, upstream=True)))

    def api_logs(request: Request) -> Response:
        if not ledger.has("logs"):
            return unsupported("per-attempt logs (Run.logs)")
        run = ledger.run(request.path_params["run_id"])
        return _json_default(ledger.logs(run, need_task(request),
                                         q_int(request, "attempt", None)))

    def api_approvals(request: Request) -> Response:
        if not ledger.has("approvals"):
            return unsupported("approvals (Run.approvals)")
        return _json_default(ledger.approvals(ledger.run(request.path_params["run_id"])))

    def api_usage(request: Request) -> Response:
        if not ledger.has("usage"):
            return unsupported("model usage (Run.usage)")
        return _json_default(ledger.usage(ledger.run(request.path_params["run_id"])))

    def metrics(request: Request) -> Response:
        """Prometheus text: what drivers with ``LEDGERFLOW_PROMETHEUS`` wrote for this ledger."""
        from ledgerflow_observability.prometheus import CONTENT_TYPE, exposition
        return Response(exposition(cfg.store),
                        headers={"content-type": CONTENT_TYPE, "cache-control": "no-store"})

    # -- actions -------------------------------------------------------------------------
    def action(fn: Callable[..., dict[str, Any]], code: int = 200, *, decides: bool = False
               ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            who = await run_in_threadpool(
                access.caller, request.headers, request.query_params.get("token"),
                allow_actions=cfg.allow_actions, action_token=cfg.token,
                tokens=cfg.approver_tokens, allowed_hosts=cfg.allowed_hosts, decides=decides)
            raw = await request.body()
            try:
                body = json.loads(raw) if raw.strip() else {}
            except ValueError:
                body = None
            if not isinstance(body, dict):
                return JSONResponse({"error": "the request body must be a JSON object",
                                     "hint": 'send {"task_key": "..."} or nothing'},
                                    status_code=400)
            args = (request.path_params.get("run_id", ""), body) + ((who,) if decides else ())
            doc = await run_in_threadpool(fn, *args)
            return JSONResponse(doc, status_code=code)
        return endpoint

    def whoami(request: Request) -> Response:
        """Whose decisions this request's token makes (the page shows it; no token: none)."""
        kind, name = access.who(request.headers, request.query_params.get("token"),
                                action_token=cfg.token, tokens=cfg.approver_tokens)
        if kind == "action":
            from ledgerflow.identity import decider
            name = decider(None)
        return JSONResponse({"token": kind or None, "decides_as": name})

    routes = [
        Route("/", runs_page),
        Route("/runs/{run_id}", run_page),
        Route("/runs/{run_id}/items", items_fragment),
        Route("/runs/{run_id}/inspect", inspect_fragment),
        Route("/runs/{run_id}/lineage", lineage_fragment),
        Route("/runs/{run_id}/graph.svg", graph_svg),
        Route("/runs/{run_id}/usage", usage_fragment),
        Route("/api/runs", api_runs),
        Route("/api/runs/{run_id}", api_status),
        Route("/api/runs/{run_id}/page", api_page),
        Route("/api/runs/{run_id}/tasks", api_tasks),
        Route("/api/runs/{run_id}/groups", api_groups),
        Route("/api/runs/{run_id}/timeline", api_timeline),
        Route("/api/runs/{run_id}/attempts", api_attempts),
        Route("/api/runs/{run_id}/lineage", api_lineage),
        Route("/api/runs/{run_id}/notices", api_notices),
        Route("/api/runs/{run_id}/graph", api_graph),
        Route("/api/runs/{run_id}/logs", api_logs),
        Route("/api/runs/{run_id}/approvals", api_approvals),
        Route("/api/runs/{run_id}/usage", api_usage),
        Route("/api/runs/{run_id}/calls", api_calls),
        Route("/api/runs/{run_id}/cancel",
              action(lambda rid, _b: actions.cancel(ledger, rid)), methods=["POST"]),
        Route("/api/runs/{run_id}/resume",
              action(lambda rid, _b: actions.resume(ledger, rid), 202), methods=["POST"]),
        Route("/api/runs/{run_id}/approve", action(
            lambda rid, b, who: actions.approve(ledger, rid, b, who), decides=True),
            methods=["POST"]),
        Route("/api/runs/{run_id}/reject", action(
            lambda rid, b, who: actions.reject(ledger, rid, b, who), decides=True),
            methods=["POST"]),
        Route("/api/whoami", whoami),
        Route("/api/start", action(lambda _rid, b: actions.start(ledger, b), 202),
              methods=["POST"]),
        Route("/api/pipelines", lambda _r: JSONResponse(
            [{"target": t, "last_run": r} for t, r in actions.known_targets(ledger).items()])),
        Route("/metrics", metrics),
        Route("/favicon.ico", lambda _r: PlainTextResponse("", status_code=204)),
    ]
    app = Starlette(routes=routes,
                    exception_handlers={PipelineError: on_error, Exception: on_bug})
    return HostGuard(RedactBodies(app, Redactor(cfg.store)), cfg.allowed_hosts)


def _json_default(doc: object) -> Response:
    """JSON with non-JSON values (times, bytes) as strings, as the CLI's ``default=str``."""
    body = json.dumps(doc, default=str, ensure_ascii=False, separators=(",", ":"))
    return Response(body, media_type="application/json")
