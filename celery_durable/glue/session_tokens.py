"""Messages that follow a write carry its session token; stale-looking deliveries retry (issue 16).

On a store read by another process with weaker than strong consistency (Cosmos DB at *Session*,
Azure's default), the handler of a message could read a replica that has not seen the write
the message follows, and drop the delivery ("no such step", "missing"). So:

* every engine message (drive, activity, timer, outbox effect) carries, in the header
  :data:`SESSION_HEADER`, the store's token for the partition it concerns
  (:meth:`Store.session_token`; ``None`` on SQLite and memory, then no header is added);
* its handler hands the token to :meth:`Store.use_session_token` before reading; messages
  without the header (older senders) work as before;
* a delivery dropped for a reason a stale read could explain is re-sent a few times
  (:data:`STALE_COUNTDOWNS`, ~4 s in all) before it is left to the recovery scan; the re-sends
  are counted as ``stale_read_retry`` (and ``stale_read_drop`` when given up) in
  :class:`~celery_durable.observability.Counters`. They do not use the task's own retry budget.
"""

from __future__ import annotations

import logging
from typing import Any

from celery_durable.errors import ConfigurationError
from celery_durable.glue.extension import durable_of
from celery_durable.glue.wire import serializer

__all__ = ["SESSION_HEADER", "STALE_HEADER", "STALE_COUNTDOWNS", "session_headers", "use_session", "retry_stale"]

log = logging.getLogger("celery_durable.consistency")

#: message header holding the store's session token (an opaque string) for the message's partition
SESSION_HEADER = "durable_session"
#: message header counting the re-sends of a delivery that looked stale
STALE_HEADER = "durable_stale"
#: countdowns of those re-sends (seconds); after the last the delivery waits for recovery
STALE_COUNTDOWNS = (0.2, 0.5, 1.0, 2.0)


def _engine(app: Any) -> Any:
    try:
        return durable_of(app).engine_if_built
    except ConfigurationError:
        return None


def session_headers(app: Any, pk: str) -> dict[str, str]:
    """``{SESSION_HEADER: token}`` for a message about partition ``pk``, or ``{}``."""
    engine = _engine(app)
    if engine is None:
        return {}
    try:
        token = engine.store.session_token(pk)
    except Exception:  # a token is an optimisation of promptness: never fail a send for it
        log.debug("no session token for %s", pk, exc_info=True)
        return {}
    return {SESSION_HEADER: token} if isinstance(token, str) and token else {}


def header(request: Any, name: str) -> Any:
    """A custom message header of a task request (Celery puts them on the request and in ``headers``)."""
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def use_session(store: Any, request: Any, pk: str) -> None:
    """Make the store's next reads of ``pk`` see what the message's token covers (if it has one)."""
    token = header(request, SESSION_HEADER)
    if isinstance(token, str) and token:
        store.use_session_token(pk, token)


def retry_stale(task: Any, counters: Any, why: str) -> bool:
    """Re-send this delivery shortly (same task id, arguments, headers and retry count) because
    what it read may have been stale; ``False`` once :data:`STALE_COUNTDOWNS` are used up."""
    request = task.request
    try:
        done = int(header(request, STALE_HEADER) or 0)
    except (TypeError, ValueError):
        done = len(STALE_COUNTDOWNS)
    if done >= len(STALE_COUNTDOWNS) or getattr(request, "is_eager", False):
        if done:
            counters.incr("stale_read_drop")
            log.warning("%s [%s]: %s after %d tries; left to recovery", task.name, request.id, why, done)
        return False
    headers = dict(getattr(request, "headers", None) or {})
    headers[STALE_HEADER] = done + 1
    countdown = STALE_COUNTDOWNS[done]
    task.signature_from_request(
        request, countdown=countdown, headers=headers, serializer=serializer(task.app)
    ).apply_async()
    counters.incr("stale_read_retry")
    log.info("%s [%s]: %s; may be a stale read, retrying in %.1f s", task.name, request.id, why, countdown)
    return True
