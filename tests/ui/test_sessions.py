"""The UI's browser sessions and CSRF tokens (ui/auth.py), signed with itsdangerous (issue 25:
a kept library rather than hand-written signing): a session expires, a tampered or foreign
cookie is no session, and the CSRF token belongs to its session."""

from __future__ import annotations

from typing import Any

import pytest
from itsdangerous import timed
from starlette.requests import Request

from celery_durable.ui.auth import COOKIE, SESSION_MAX_AGE, Guard


def _request(cookie: str | None) -> Request:
    headers = [] if cookie is None else [(b"cookie", f"{COOKIE}={cookie}".encode())]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers, "query_string": b""})


def test_a_session_lasts_its_max_age_then_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = Guard("t" * 32)
    cookie = guard.new_session()
    assert guard.session(_request(cookie)) is not None and guard.csrf(_request(cookie)) is not None
    now = timed.time.time()

    def later(seconds: float) -> Any:
        return lambda: now + seconds

    monkeypatch.setattr(timed.time, "time", later(SESSION_MAX_AGE - 60))
    assert guard.session(_request(cookie)) is not None
    monkeypatch.setattr(timed.time, "time", later(SESSION_MAX_AGE + 60))
    assert guard.session(_request(cookie)) is None and guard.csrf(_request(cookie)) is None


def test_a_tampered_or_foreign_cookie_is_no_session() -> None:
    guard, other = Guard("t" * 32), Guard("u" * 32)
    cookie = guard.new_session()
    nonce, rest = cookie.split(".", 1)
    assert guard.session(_request(nonce + "x." + rest)) is None
    assert guard.session(_request(cookie[:-2] + ("AA" if not cookie.endswith("AA") else "BB"))) is None
    assert guard.session(_request(other.new_session())) is None  # signed under another token
    assert guard.session(_request("")) is None and guard.session(_request(None)) is None


def test_the_csrf_token_is_its_sessions_and_not_the_cookie() -> None:
    guard = Guard("t" * 32)
    a, b = guard.new_session(), guard.new_session()
    csrf_a, csrf_b = guard.csrf(_request(a)), guard.csrf(_request(b))
    assert csrf_a and csrf_b and csrf_a != csrf_b
    assert csrf_a not in a and guard.csrf(_request(a)) == csrf_a  # stable for the session
