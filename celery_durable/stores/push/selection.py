"""Which result push a process uses (``durable_result_push``; the seam is :mod:`.base`)."""

from __future__ import annotations

from collections.abc import Collection

from celery_durable.stores.base import Store, find_inner
from celery_durable.stores.push.base import REDIS_SCHEMES, NoPush, Notifier

__all__ = ["build_notifier"]


def build_notifier(mode: str, store: Store, redis_url: str | None, statuses: Collection[str]) -> Notifier:
    """The notifier ``durable_result_push`` asks for (see Settings).

    ``auto``: a PostgreSQL store's LISTEN/NOTIFY (the NOTIFY rides in the commit's transaction),
    else Redis pub/sub at ``redis_url`` (the Celery broker or result backend, if Redis), else
    polling. ``off``: polling. A ``redis://`` URL: Redis pub/sub there. ``statuses``: the exec
    statuses whose write notifies (the terminal ones).
    """
    if mode == "off":
        return NoPush()
    if mode.startswith(REDIS_SCHEMES):
        redis_url = mode
    else:
        pg = find_inner(store, lambda s: hasattr(s, "enable_push"))
        if pg is not None:
            notifier: Notifier = pg.enable_push(frozenset(statuses))  # type: ignore[attr-defined]
            return notifier
    if redis_url:
        from celery_durable.stores.push.redis import RedisNotifier

        return RedisNotifier(redis_url)
    return NoPush()
