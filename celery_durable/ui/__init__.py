"""``celery -A proj durable ui``: a web timeline of executions (the ``[ui]`` extra).

Lists executions (filters, cursor paging), draws an execution's step timeline (refreshed while
it runs), shows its outbox lanes, and signals, cancels, retries or resumes it behind a token
(:mod:`.auth`). Built on Starlette, Uvicorn and Jinja2; no JavaScript build.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

from celery_durable.glue.bootsteps import probe_store
from celery_durable.ui.access import Access
from celery_durable.ui.app import create_app
from celery_durable.ui.auth import Guard, new_token

if TYPE_CHECKING:
    from celery_durable.app import Durable

__all__ = ["Access", "create_app", "serve", "new_token"]


def serve(
    durable: Durable,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    out: TextIO | None = None,
    allow_hosts: Iterable[str] = (),
    public_read: bool = False,
) -> None:
    """Serve the UI until interrupted. Without ``token`` a random one is made and printed once.

    Reads are open on a loopback bind only (or with ``public_read``); only ``localhost``, IP
    addresses and ``allow_hosts`` are answered as Host names (access.py)."""
    import uvicorn

    out = out or sys.stderr
    given = token is not None
    token = token or new_token()
    Guard(token)  # a token too short is refused before the store is opened
    access = Access.for_bind(host, allow_hosts, public_read)
    probe_store(durable.engine.store, "the UI")  # as the worker: a store it cannot use ends it here
    app = create_app(durable.engine, token, access, lambda: durable._schedules)
    print(f"celery-durable UI on http://{host}:{port}/", file=out)
    what = "actions" if access.public_read else "pages and actions"
    if given:
        print(f"{what}: use the token given by --token / DURABLE_UI_TOKEN", file=out)
    else:
        print(f"{what} token (shown once): {token}", file=out)
    for line in access.describe(host, port):
        print(line, file=out)
    out.flush()
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
