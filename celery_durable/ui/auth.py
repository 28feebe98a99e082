"""Who may act: the start-up token, browser sessions and their CSRF tokens.

Reading pages needs nothing on a loopback bind (only this machine reaches it) and the token on
any other unless the operator chose ``--public-read``; only configured Host names are answered
(:mod:`.access`, against DNS rebinding); every action
(signal, cancel, retry, resume) is a POST that must carry one of:

* ``Authorization: Bearer <token>`` — for scripts. A browser never adds that header to a
  cross-site request without a CORS preflight, which this app never grants, so it needs no
  CSRF token of its own.
* a session cookie (set by ``POST /login`` with the token) *and* a ``csrf`` form field that
  matches it. The cookie is ``HttpOnly``/``SameSite=Strict``, and the field is a signature of the
  session under a key derived from the token: a page on another site can make the browser send
  the cookie but can neither read nor compute the field. A request whose ``Origin`` is another
  site is refused as well (defence in depth).

Nothing is stored server side: sessions (timestamped, valid for :data:`SESSION_MAX_AGE`) and
CSRF tokens are signed with ``itsdangerous`` (what Starlette's and Flask's sessions use), so they
survive a restart with the same token and die with a new one. The token is compared in constant
time and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from itsdangerous import BadSignature, Signer, TimestampSigner
from starlette.requests import Request

__all__ = ["Guard", "COOKIE", "MIN_TOKEN_LENGTH", "SESSION_MAX_AGE", "new_token", "same_origin", "safe_next"]

COOKIE = "durable_ui_session"
MIN_TOKEN_LENGTH = 16
#: seconds a browser session lasts after ``POST /login`` (then the token is asked again)
SESSION_MAX_AGE = 12 * 3600


def new_token() -> str:
    """A random action token (32 bytes, URL-safe)."""
    return secrets.token_urlsafe(32)


class Guard:
    """Checks the token, issues sessions and their CSRF tokens, and authorizes actions."""

    def __init__(self, token: str) -> None:
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"the UI token must be at least {MIN_TOKEN_LENGTH} characters long")
        self._token = token.encode()
        # a key of its own, so a leaked CSRF token or cookie says nothing about the token itself
        key = hashlib.sha256(b"celery-durable-ui\0" + self._token).digest()
        self._sessions = TimestampSigner(key, salt="session", digest_method=hashlib.sha256)
        self._csrf = Signer(key, salt="csrf", digest_method=hashlib.sha256)

    def token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    def new_session(self) -> str:
        """A cookie value: ``<nonce>.<timestamp>.<signature>``."""
        return self._sessions.sign(secrets.token_urlsafe(18)).decode()

    def session(self, request: Request) -> str | None:
        """The nonce of the request's valid, unexpired session cookie, or None."""
        value = request.cookies.get(COOKIE) or ""
        try:
            nonce = self._sessions.unsign(value, max_age=SESSION_MAX_AGE).decode()
        except (BadSignature, UnicodeError):  # forged, tampered, expired or not ours
            return None
        return nonce or None

    def csrf(self, request: Request) -> str | None:
        """The CSRF token to put in the forms of this request's session (None: not logged in)."""
        nonce = self.session(request)
        return None if nonce is None else self._csrf.get_signature(nonce).decode()

    def refusal(self, request: Request, form_csrf: str | None) -> str | None:
        """Why this POST may not act (None: it may)."""
        auth = request.headers.get("authorization", "")
        if auth:
            scheme, _, given = auth.partition(" ")
            if scheme.lower() == "bearer" and self.token_ok(given.strip()):
                return None
            return "invalid token"
        if not same_origin(request):
            return "cross-site request refused"
        expected = self.csrf(request)
        if expected is None:
            return "not logged in: give the token (POST /login) or an Authorization: Bearer header"
        if not form_csrf or not hmac.compare_digest(form_csrf.encode(), expected.encode()):
            return "missing or invalid CSRF token: reload the page"
        return None


def same_origin(request: Request) -> bool:
    """False when the browser says the request comes from another origin (no header: allowed)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin != "null" and urlsplit(origin).netloc == request.headers.get("host", "")


def safe_next(target: str | None) -> str:
    """A local path to go back to after the login (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
