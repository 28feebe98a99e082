"""``celery -A proj durable ui``: a web timeline of executions (the ``[ui]`` extra).

Lists executions (filters, cursor paging), draws an execution's step timeline (refreshed while
it runs), shows its outbox lanes, and signals, cancels, retries or resumes it behind a token
(:mod:`.auth`). Built on Starlette, Uvicorn and Jinja2; no JavaScript build.
"""

from __future__ import annotations

import ipaddress
import sys
from typing import TYPE_CHECKING, TextIO

from .app import create_app
from .auth import Guard, new_token

if TYPE_CHECKING:
    from ..app import Durable

__all__ = ["create_app", "serve", "new_token"]


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(durable: Durable, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
          out: TextIO | None = None) -> None:  # fmt: skip
    """Serve the UI until interrupted. Without ``token`` a random one is made and printed once."""
    import uvicorn

    out = out or sys.stderr
    given = token is not None
    token = token or new_token()
    Guard(token)  # a token too short is refused before the store is opened
    app = create_app(durable.engine, token)
    if _loopback(host):
        # reads need no token because only this machine reaches a loopback address; refusing other
        # Host names keeps a web page whose DNS name was re-pointed at 127.0.0.1 (rebinding) out
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        names = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=sorted(names))
    print(f"celery-durable UI on http://{host}:{port}/", file=out)
    if given:
        print("actions: use the token given by --token / DURABLE_UI_TOKEN", file=out)
    else:
        print(f"actions token (shown once): {token}", file=out)
    if not _loopback(host):
        print(f"warning: listening on {host}: anyone who reaches it can read executions", file=out)
    out.flush()
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
