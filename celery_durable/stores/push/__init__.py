"""Pushed results: a waiter is woken when an execution ends instead of polling the store.

``base`` is the seam, ``redis`` (pub/sub) and ``postgres`` (LISTEN/NOTIFY) the transports,
``selection`` picks one for a process (``durable_result_push``).
"""

from typing import Any

from celery_durable._moved import moved_attr

#: the names of the module this package replaced (issue 24), still found here
OLD_NAMES = frozenset({"Notifier", "Waiter", "NoPush", "Hub", "payload_of", "PUSH_MODES", "REDIS_SCHEMES"})
#: a star import binds them as it did
__all__ = sorted(OLD_NAMES)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, "celery_durable.stores.push.base", OLD_NAMES)
