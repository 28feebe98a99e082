"""Which Host names the UI answers, and whether reading it needs the token.

Two defences, one against each way a page could be read by someone it should not be:

* **DNS rebinding** — a web page on ``attacker.example`` whose name is re-pointed at the UI's
  address reads it same-origin. Its requests carry ``Host: attacker.example``, so only the
  names the operator configured (``--allow-host``) are answered, plus ``localhost`` and IP
  addresses (a page can only be same-origin with an IP address by being served from it).
* **Anyone who reaches the port** — on a loopback bind only this machine does, so reads are open
  there; on any other bind (``--host 0.0.0.0``, which a container needs even to publish the
  port on the host's loopback) every page and the JSON API need the token too (the login's
  session cookie or ``Authorization: Bearer``), unless the operator says ``--public-read``.
  ``/login``, ``/static`` and ``/healthz`` stay open. Actions always need the token (auth.py).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from celery_durable.ui.auth import Guard

__all__ = ["Access", "Gate", "is_loopback"]

#: paths anyone may read: the login form, its assets, the liveness probe
OPEN_PATHS = ("/login", "/healthz")
OPEN_PREFIXES = ("/static/",)


def is_loopback(host: str) -> bool:
    """Whether the bind address ``host`` is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


#: a DNS name as a browser sends it (lower case): labels of letters, digits and inner hyphens
_DNS_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def _ip(name: str) -> bool:
    """An IPv4 address, or an IPv6 one in brackets (as in a URL)."""
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    elif ":" in name:
        return False
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _name_of(host_header: str) -> str | None:
    """The name of a ``Host`` header without its port (``[::1]:80`` -> ``[::1]``); None if the
    header is not ``name[:port]`` with a numeric port."""
    host = host_header.strip().lower()
    if host.startswith("["):
        end = host.find("]") + 1
        name, rest = (host[:end], host[end:]) if end else (host, "")
    else:
        name, colon, port = host.partition(":")
        rest = colon + port
    if rest and not (rest[0] == ":" and rest[1:].isdigit() and len(rest) <= 6):
        return None
    return name if _ip(name) or _DNS_NAME.fullmatch(name) else None


def _allowed_name(given: str) -> str:
    """An ``--allow-host`` value: a DNS name or ``*.`` and one, without a port (else ValueError)."""
    name = given.strip().lower()
    if _DNS_NAME.fullmatch(name.removeprefix("*.")) is None:
        raise ValueError(f"--allow-host takes a host name (or *.domain) without a port, not {given!r}")
    return name


@dataclass(frozen=True)
class Access:
    """What the UI answers (see the module docstring)."""

    #: extra Host names (lower case, no port); ``*.example.com`` matches its subdomains
    names: frozenset[str] = frozenset()
    #: reads need no token
    public_read: bool = True

    @classmethod
    def for_bind(cls, host: str, allow_hosts: Iterable[str] = (), public_read: bool = False) -> Access:
        """The access of a server bound to ``host``: reads open on loopback or if ``public_read``."""
        names = {_allowed_name(n) for n in allow_hosts}
        if not _ip(host) and host not in ("", "*"):
            names.add(host.lower())  # bound to a name: that name is its own
        return cls(frozenset(names), public_read or is_loopback(host))

    def host_ok(self, host_header: str) -> bool:
        name = _name_of(host_header)
        if name is None:
            return False
        if name == "localhost" or _ip(name) or name in self.names:
            return True
        return any(p.startswith("*.") and name.endswith(p[1:]) for p in self.names)

    def may_read(self, request: Request, guard: Guard) -> bool:
        path = request.url.path
        if self.public_read or request.method == "POST":  # a POST is the Guard's (auth.py)
            return True
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            return True
        if guard.session(request) is not None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and guard.token_ok(given.strip())

    def describe(self, host: str, port: int) -> list[str]:
        """The start-up lines saying what is protected (never the token)."""
        names = ", ".join(sorted(self.names | {"localhost"})) + " and IP addresses"
        lines = [f"Host names answered: {names} (others get 400: DNS rebinding)"]
        if is_loopback(host):
            lines.append("pages: open to this machine (loopback bind); actions need the token")
        elif self.public_read:
            lines.append(
                f"warning: --public-read on {host}:{port}: anyone who reaches it can read executions "
                "(payloads, results, errors); actions need the token"
            )
        else:
            lines.append(f"listening on {host}: every page, the API and the actions need the token (log in at /login)")
        if not is_loopback(host) and not self.names:
            lines.append("a DNS name of this server is answered only if given with --allow-host NAME")
        return lines


class Gate:
    """ASGI middleware: refuse other Host names (400) and, unless reads are public, unauthenticated
    reads (a browser is sent to the login, a script gets 401)."""

    def __init__(self, app: ASGIApp, access: Access, guard: Guard) -> None:
        self.app = app
        self.access = access
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        response: Response | None = None
        if not self.access.host_ok(request.headers.get("host", "")):
            response = PlainTextResponse("Invalid host header", 400)
        elif not self.access.may_read(request, self.guard):
            response = _login_needed(request)
        if response is None:
            await self.app(scope, receive, send)
        else:
            await response(scope, receive, send)


def _login_needed(request: Request) -> Response:
    headers: dict[str, Any] = {"Cache-Control": "no-store", "WWW-Authenticate": 'Bearer realm="celery-durable"'}
    accept = request.headers.get("accept", "")
    if request.url.path.startswith("/api/") or "application/json" in accept or "text/html" not in accept:
        return JSONResponse({"error": "this UI needs the token: Authorization: Bearer <token>"}, 401, headers=headers)
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303, headers=headers)
