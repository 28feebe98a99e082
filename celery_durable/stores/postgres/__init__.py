"""The PostgreSQL store (``store``) and its URL, connection pool and error translation
(``connection``).
"""

from typing import Any

from celery_durable._moved import moved_attr

#: the names of the module this package replaced (issue 24), still found here
OLD_NAMES = frozenset({"PostgresStore", "from_url"})
#: a star import binds them as it did
__all__ = sorted(OLD_NAMES)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, "celery_durable.stores.postgres.store", OLD_NAMES)
