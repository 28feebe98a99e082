"""The Schedules page: every schedule (managed ones and those declared in code) with its timing,
next fire, last run and its status, paused or not; pause, resume and trigger a managed one (POST,
behind the same token and CSRF check as every action: auth.Guard)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from celery_durable.engine.core import Engine
from celery_durable.errors import DurableError, StoreUnavailable
from celery_durable.schedules import Schedules
from celery_durable.ui.auth import Guard

__all__ = ["SchedulesPage", "Pages", "SCHEDULE_ACTIONS"]

SCHEDULE_ACTIONS = ("pause", "resume", "trigger")
#: what a redirect after an action may say (a code in the URL, never free text)
MESSAGES = {
    "paused": "paused: no tick fires until resumed",
    "pause-already": "already paused",
    "resumed": "resumed",
    "resume-already": "not paused",
    "triggered": "started one execution",
    "trigger-skipped": "not started: its overlap policy skipped or kept it",
}


@dataclass
class Pages:
    """What the page needs of the UI (app.py's helpers, handed over: app.py imports this module)."""

    render: Callable[..., HTMLResponse]
    answer: Callable[[Request, int, str], Response]
    headers: Callable[[], dict[str, str]]
    wants_json: Callable[[Request], bool]


class SchedulesPage:
    """The page and its actions, over one engine, guard and the UI's helpers."""

    def __init__(
        self, engine: Engine, guard: Guard, pages: Pages, code: Callable[[], Mapping[str, dict[str, Any]]]
    ) -> None:
        self.engine, self.guard, self.pages = engine, guard, pages
        self.schedules = Schedules(lambda: engine, engine.registry, code)

    def page(self, request: Request) -> Response:
        message = MESSAGES.get(request.query_params.get("msg", ""))
        rows = self.schedules.list()
        return self.pages.render(request, "schedules.html", rows=rows, message=message)

    async def action(self, request: Request) -> Response:
        _answer, _headers, _wants_json = self.pages.answer, self.pages.headers, self.pages.wants_json
        name = request.path_params["action"]
        if name not in SCHEDULE_ACTIONS:
            return _answer(request, 404, f"unknown schedule action {name!r}")
        form = await request.form()
        refusal = self.guard.refusal(request, str(form.get("csrf") or "") or None)
        if refusal is not None:
            return _answer(request, 403, refusal)
        schedule = str(form.get("name") or "")
        by = f"ui:{request.client.host if request.client else '?'}"  # recorded with the action
        try:
            if self.schedules.get(schedule) is None:
                return _answer(request, 404, f"no schedule named {schedule!r}")
            if name == "trigger":
                code = "triggered" if self.schedules.trigger(schedule, by=by) else "trigger-skipped"
            else:
                done = getattr(self.schedules, name)(schedule, by=by)
                code = ("paused" if name == "pause" else "resumed") if done else f"{name}-already"
        except StoreUnavailable:
            raise
        except DurableError as exc:  # a schedule declared in code, say
            return _answer(request, 400, str(exc))
        if _wants_json(request):
            return JSONResponse({"ok": True, "message": MESSAGES[code]}, headers=_headers())
        return RedirectResponse(f"/schedules?msg={code}", status_code=303, headers=_headers())
