"""The Starlette application: pages, the JSON the execution page polls, and the actions.

Pages are rendered on the server by Jinja2 with autoescape on (every id, payload, error and
signal value is text, never markup), under a Content-Security-Policy that allows no inline
script at all. Reads go through the engine's read model (:class:`~..engine.admin.Admin`: the
list is one store query per page, an execution one partition query); actions through the same
engine calls as the ``durable`` CLI, behind :class:`.auth.Guard`.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from celery_durable.engine.admin.counts import status_counts
from celery_durable.engine.admin.family import family
from celery_durable.engine.admin.operator import Admin, ExecutionDetail, OperationRefused
from celery_durable.engine.admin.pause import pause, unpause
from celery_durable.engine.admin.terminate import terminate
from celery_durable.engine.admin.timeline import STATUSES
from celery_durable.engine.admin.waiting import activity_states
from celery_durable.engine.admin.wording import ts
from celery_durable.engine.core import Engine
from celery_durable.engine.documents.schema import NOT_STARTED, Status
from celery_durable.engine.signals.inbox import declared_signals
from celery_durable.errors import DurableError, PayloadValidationError, StoreUnavailable, UnknownWorkflowError
from celery_durable.glue.bootsteps import PROBE_ID, PROBE_PK
from celery_durable.stores.base import MAX_PAGE_SIZE
from celery_durable.stores.search import parse_pairs
from celery_durable.ui.access import Access, Gate
from celery_durable.ui.auth import COOKIE, Guard, safe_next
from celery_durable.ui.schedules_page import Pages, SchedulesPage
from celery_durable.ui.views import (
    chart,
    confirms,
    detail_json,
    duration,
    exec_url,
    lanes_of,
    parse_age,
    pretty,
    read_lane,
    signal_schemas,
)

__all__ = ["create_app", "ACTIONS"]

log = logging.getLogger("celery_durable.ui")

HERE = Path(__file__).parent
ACTIONS = ("signal", "cancel", "terminate", "retry", "resume", "pause", "unpause")
#: what the list's selection can do to many executions at once, and how many at most
BATCH_ACTIONS = ("cancel", "terminate", "retry", "resume", "pause", "unpause")
MAX_BATCH = 200
#: which statuses each action applies to (the page shows its form only then)
WHEN = {
    "signal": "running scheduled queued",
    "cancel": "running scheduled queued",
    "terminate": "running",
    "retry": "failed",
    "resume": "running failed cancelled timed_out",
    "pause": "running scheduled queued",
    "unpause": "running scheduled queued",
}
#: the messages a redirect after an action may show (a code in the URL, never free text)
MESSAGES = {
    "signal-delivered": "signal delivered",
    "signal-ignored": "signal ignored: the execution has ended",
    "cancel-requested": "cancel requested",
    "terminated": "terminated: nothing more runs",
    "terminate-finished": "already finished: nothing to terminate",
    "cancel-finished": "already finished: nothing to cancel",
    "retry": "retrying from the failed step",
    "resume": "resumed",
    "paused": "paused: nothing of it runs until unpaused",
    "pause-already": "already paused",
    "unpaused": "unpaused: driven now",
    "unpause-already": "not paused",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
DEFAULT_PAGE = 50
#: failed effects, and stuck lanes and intents, the /effects page shows (of each)
PROBLEMS_SHOWN = 200


def _templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ts=ts, duration=duration, pretty=pretty, exec_url=exec_url)
    env.globals.update(statuses=STATUSES, when=WHEN)
    return env


class UI:
    """The handlers, over one engine and one guard."""

    def __init__(self, engine: Engine, guard: Guard) -> None:
        self.engine = engine
        self.admin = Admin(engine)
        self.guard = guard
        self.env = _templates()
        self.exports_metrics = _instrument(engine)

    # --- helpers ----------------------------------------------------------------------------

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.update(request=request, csrf=self.guard.csrf(request), path=request.url.path)
        html = self.env.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status, headers=_headers())

    def detail(self, execution_id: str) -> ExecutionDetail | None:
        try:
            return self.admin.describe(execution_id)
        except UnknownWorkflowError:
            return None

    def live_context(self, request: Request, detail: ExecutionDetail) -> dict[str, Any]:
        now = self.engine.clock.now()
        signals: list[str] | None = None
        schemas: dict[str, str] = {}
        if detail.summary.status in (Status.RUNNING, *NOT_STARTED):  # a scheduled or queued one takes signals too
            try:
                ex = self.engine.store.read(detail.summary.id, "exec") or {}
                wf = self.engine.registry.workflow(str(ex.get("workflow")))
                signals = declared_signals(ex, wf)
                schemas = signal_schemas(wf, signals or [])
            except DurableError:
                signals = None
        return {
            "d": detail,
            "s": detail.summary,
            "chart": chart(detail, now),
            "lanes": lanes_of(self.engine, detail),
            "signal_names": signals,
            "signal_schemas": schemas,
            "csrf": self.guard.csrf(request),
        }

    # --- pages ------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        return RedirectResponse("/executions", status_code=303)

    def metrics(self, request: Request) -> Response:
        """Prometheus text (the prometheus extra): this UI process's store calls and actions, or
        every process's sharing ``PROMETHEUS_MULTIPROC_DIR`` (workers of this machine) if set."""
        if not self.exports_metrics:
            return PlainTextResponse("metrics need the prometheus extra: pip install 'celery-durable[prometheus]'", 404)
        from celery_durable.glue.metrics import exposition

        body, content_type = exposition()
        return Response(body, headers={"Content-Type": content_type})

    def health(self, request: Request) -> Response:
        """``ok``, or 503 when the store does not answer (what a load balancer's check needs)."""
        self.engine.store.read(PROBE_PK, PROBE_ID)  # StoreUnavailable: 503 (_store_down)
        return PlainTextResponse("ok")

    def executions(self, request: Request) -> Response:
        q = request.query_params
        workflow = q.get("workflow") or None
        status = q.get("status") or None
        cursor = q.get("cursor") or None
        problems: list[str] = []
        if status is not None and status not in STATUSES:
            problems.append(f"unknown status {status!r}")
        try:
            limit = int(q.get("limit") or DEFAULT_PAGE)
            if not 1 <= limit <= MAX_PAGE_SIZE:
                raise ValueError
        except ValueError:
            problems.append(f"limit must be a number from 1 to {MAX_PAGE_SIZE}")
            limit = DEFAULT_PAGE
        now = self.engine.clock.now()
        bounds: dict[str, float | None] = {}
        for name in ("newer_than", "older_than"):
            text = q.get(name) or ""
            try:
                bounds[name] = now - parse_age(text) if text else None
            except ValueError as exc:
                problems.append(f"{name.replace('_', ' ')}: {exc}")
        search: dict[str, Any] = {}
        try:  # "customer=c-42 priority=3" (quotes for spaces), as `durable list --search`
            search = parse_pairs(shlex.split(q.get("search") or ""))
        except (DurableError, ValueError) as exc:
            problems.append(f"search: {exc}")
        filters = {k: q.get(k) or "" for k in ("workflow", "status", "newer_than", "older_than", "search")}
        filters["limit"] = str(limit)
        if problems:
            return self.page(request, "list.html", 400, rows=[], filters=filters, problems=problems, next_url=None)
        try:
            page = self.admin.executions(
                workflow, status, bounds.get("newer_than"), bounds.get("older_than"), limit, cursor, search or None
            )
        except StoreUnavailable:
            raise  # a 503 (_store_down), not the caller's mistake
        except (DurableError, ValueError) as exc:
            # a cursor from another listing, say: said on the page, not a traceback
            msg = f"{type(exc).__name__}: {exc}"
            return self.page(request, "list.html", 400, rows=[], filters=filters, problems=[msg], next_url=None)
        next_url = None
        if page.cursor is not None:
            kept = {k: v for k, v in filters.items() if v}
            next_url = "/executions?" + urlencode(kept | {"cursor": page.cursor})
        first_url = "/executions?" + urlencode({k: v for k, v in filters.items() if v}) if cursor else None
        return self.page(
            request,
            "list.html",
            rows=page.executions,
            # a waited-on activity: queued, running or backing off (its marker, read per row)
            waits=activity_states(self.engine.store, page.executions, now),
            filters=filters,
            problems=[],
            next_url=next_url,
            first_url=first_url,
            # how many in each status (of the workflow filtered on), each a link to them
            counts=[
                (
                    c,
                    "/executions?"
                    + urlencode({k: v for k, v in {"workflow": workflow, "status": c.status}.items() if v}),
                )
                for c in (status_counts(self.engine.store, workflow) if not q.get("live") else ())
            ],
        )

    def execution(self, request: Request) -> Response:
        execution_id = request.path_params["execution_id"]
        detail = self.detail(execution_id)
        if detail is None:
            return self.page(request, "missing.html", 404, what=f"no execution with id {execution_id!r}")
        message = MESSAGES.get(request.query_params.get("msg", ""))
        context = self.live_context(request, detail) | {"confirm": confirms(self.admin, detail)}
        s = detail.summary
        # read once per page load (not with each poll): a query per descendant, bounded
        context["family"] = family(self.engine.store, s, detail.children) if s.parent or detail.children else []
        return self.page(request, "execution.html", message=message, **context)

    def execution_json(self, request: Request) -> Response:
        execution_id = request.path_params["execution_id"]
        detail = self.detail(execution_id)
        if detail is None:
            return JSONResponse({"error": f"no execution with id {execution_id!r}"}, 404, headers=_headers())
        data = detail_json(detail)
        data["html"] = self.env.get_template("live.html").render(**self.live_context(request, detail))
        data["confirm"] = confirms(self.admin, detail)  # what retry/resume would forget now
        return JSONResponse(data, headers=_headers())

    def lane(self, request: Request) -> Response:
        key = request.query_params.get("key") or ""
        if not key:
            return self.page(request, "lane.html", lane=None, head=None, key="")
        try:
            head = self.engine.outbox.head(key)
        except StoreUnavailable:
            raise
        except DurableError as exc:
            head = {"error": str(exc)}
        return self.page(request, "lane.html", lane=read_lane(self.engine, key), head=head, key=key)

    def effects(self, request: Request) -> Response:
        """Failed effects and stuck lanes across every key (``OutboxEngine.problems``; a store
        outage is a 503 like every page's)."""
        problems = self.engine.outbox.problems(PROBLEMS_SHOWN)
        return self.page(request, "effects.html", p=problems, now=self.engine.clock.now())

    # --- login and actions ------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        target = safe_next(request.query_params.get("next"))
        if request.method == "GET":
            return self.page(request, "login.html", target=target, problem=None)
        form = await request.form()
        target = safe_next(str(form.get("next") or "/"))
        if not self.guard.token_ok(str(form.get("token") or "")):
            return self.page(request, "login.html", 403, target=target, problem="wrong token")
        resp = RedirectResponse(target, status_code=303, headers=_headers())
        secure = request.url.scheme == "https"
        resp.set_cookie(COOKIE, self.guard.new_session(), httponly=True, samesite="strict", secure=secure, path="/")
        return resp

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if self.guard.refusal(request, str(form.get("csrf") or "")) is not None:
            return PlainTextResponse("refused", 403, headers=_headers())
        resp = RedirectResponse("/executions", status_code=303, headers=_headers())
        resp.delete_cookie(COOKIE, path="/")
        return resp

    async def action(self, request: Request) -> Response:
        name = request.path_params["action"]
        if name not in ACTIONS:
            return PlainTextResponse(f"unknown action {name!r}", 404, headers=_headers())
        form = await request.form()
        refusal = self.guard.refusal(request, str(form.get("csrf") or "") or None)
        if refusal is not None:
            return _answer(request, 403, refusal)
        execution_id = str(form.get("id") or "")
        if not execution_id or self.detail(execution_id) is None:
            return _answer(request, 404, f"no execution with id {execution_id!r}")
        try:
            by = f"ui:{request.client.host if request.client else '?'}"  # recorded with the action
            code = self._act(name, execution_id, {k: str(v) for k, v in form.items()}, by)
        except (OperationRefused, PayloadValidationError, ValueError) as exc:
            return _answer(request, 400, str(exc), execution_id)
        except StoreUnavailable:
            raise
        except DurableError as exc:
            return _answer(request, 409, f"{type(exc).__name__}: {exc}", execution_id)
        if _wants_json(request):
            return JSONResponse({"ok": True, "message": MESSAGES[code]}, headers=_headers())
        return RedirectResponse(f"{exec_url(execution_id)}?msg={code}", status_code=303, headers=_headers())

    async def batch(self, request: Request) -> Response:
        """Cancel, retry or resume the executions selected in the list (``id`` repeated), each
        as its own action (recorded on each, refused ones said per execution, none skipped)."""
        form = await request.form()
        refusal = self.guard.refusal(request, str(form.get("csrf") or "") or None)
        if refusal is not None:
            return _answer(request, 403, refusal)
        name = str(form.get("action") or "")
        if name not in BATCH_ACTIONS:
            return _answer(request, 400, f"a batch action is one of {', '.join(BATCH_ACTIONS)}, not {name!r}")
        ids = list(dict.fromkeys(str(v) for v in form.getlist("id") if str(v)))
        if not ids or len(ids) > MAX_BATCH:
            return _answer(request, 400, f"select from 1 to {MAX_BATCH} executions")
        by = f"ui:{request.client.host if request.client else '?'}"
        results: list[dict[str, Any]] = []
        for execution_id in ids:
            try:  # an unknown id: the action's own UnknownWorkflowError says so
                results.append(
                    {"id": execution_id, "ok": True, "message": MESSAGES[self._act(name, execution_id, {}, by)]}
                )
            except StoreUnavailable:
                raise
            except (DurableError, ValueError) as exc:
                results.append({"id": execution_id, "ok": False, "message": str(exc)})
        if _wants_json(request):
            return JSONResponse({"action": name, "results": results}, headers=_headers())
        return self.page(request, "batch.html", action=name, results=results)

    def _act(self, name: str, execution_id: str, form: dict[str, str], by: str = "ui") -> str:
        """Run one action; the message code to show (the engine's calls, as the CLI makes them)."""
        if name == "signal":
            signal = form.get("name", "").strip()
            if not signal:
                raise ValueError("a signal needs a name")
            try:
                value = json.loads(form.get("value") or "null")
            except json.JSONDecodeError as exc:
                raise ValueError(f"the value is not valid JSON: {exc}") from exc
            except RecursionError as exc:
                raise ValueError("the value is nested too deeply") from exc
            # who sent it is recorded in the same batch as the value (engine/admin/oplog.py)
            if not self.engine.signal(execution_id, signal, value, by=by):
                return "signal-ignored"
            return "signal-delivered"
        if name == "cancel":
            return "cancel-requested" if self.engine.cancel(execution_id, by=by) else "cancel-finished"
        if name == "terminate":
            return "terminated" if terminate(self.engine, execution_id, by) else "terminate-finished"
        if name in ("pause", "unpause"):
            done = (pause if name == "pause" else unpause)(self.engine, execution_id, by)
            return f"{name}d" if done else f"{name}-already"
        if name == "retry":
            status = self.engine.read_exec(execution_id).get("status")
            if status != Status.FAILED:
                raise OperationRefused(f"{execution_id} is {status}, not failed")
            self.admin.retry(execution_id, by=by)
            return "retry"
        status = self.engine.read_exec(execution_id).get("status")
        if status == Status.COMPLETED:
            raise OperationRefused(f"{execution_id} is completed; nothing to resume")
        self.admin.resume(execution_id, by=by)
        return "resume"


def _instrument(engine: Engine) -> bool:
    """Count this UI's store calls and actions in Prometheus metrics, if prometheus_client is here."""
    try:
        from celery_durable.glue.metrics import instrument_engine
    except ImportError:
        return False
    instrument_engine(engine)
    return True


def _headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
    }


def _wants_json(request: Request) -> bool:
    return "authorization" in request.headers or "application/json" in request.headers.get("accept", "")


def _answer(request: Request, status: int, message: str, execution_id: str | None = None) -> Response:
    """A refused or failed action: JSON for scripts, a short page for a browser."""
    if _wants_json(request):
        return JSONResponse({"ok": False, "error": message}, status, headers=_headers())
    ui: UI = request.app.state.ui
    back = exec_url(execution_id) if execution_id else "/executions"
    return ui.page(request, "refused.html", status, message=message, back=back)


async def _store_down(request: Request, exc: Exception) -> Response:
    """A store outage is the server's trouble, not the client's: 503, as a probe expects."""
    log.warning("UI %s: %s", request.url.path, exc)
    return _answer(request, 503, f"the store is unavailable: {exc}")


def create_app(
    engine: Engine,
    token: str,
    access: Access | None = None,
    code_schedules: Callable[[], Mapping[str, dict[str, Any]]] = dict,
) -> Starlette:
    """The web UI over ``engine`` (its store, registry and dispatcher); actions need ``token``.
    ``access``: the Host names it answers and whether reads need the token (access.py; None: any
    Host, reads open, as behind a proxy of the caller's that checks them). ``code_schedules``:
    the app's ``Durable.schedule`` entries, listed on the Schedules page."""
    ui = UI(engine, Guard(token))
    schedules = SchedulesPage(engine, ui.guard, Pages(ui.page, _answer, _headers, _wants_json), code_schedules)
    routes = [
        Route("/", ui.index),
        Route("/healthz", ui.health),
        Route("/metrics", ui.metrics),
        Route("/executions", ui.executions),
        Route("/executions/{execution_id:path}", ui.execution),
        Route("/api/executions/{execution_id:path}", ui.execution_json),
        Route("/lanes", ui.lane),
        Route("/effects", ui.effects),
        Route("/schedules", schedules.page),
        Route("/schedules/actions/{action}", schedules.action, methods=["POST"]),
        Route("/login", ui.login, methods=["GET", "POST"]),
        Route("/logout", ui.logout, methods=["POST"]),
        Route("/actions/batch", ui.batch, methods=["POST"]),
        Route("/actions/{action}", ui.action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={StoreUnavailable: _store_down})
    app.state.ui = ui
    if access is not None:
        app.add_middleware(Gate, access=access, guard=ui.guard)
    return app
