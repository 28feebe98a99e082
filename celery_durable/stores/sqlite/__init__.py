"""The embedded default store: one SQLite file in WAL mode (``store``), its file permissions
(``files``) and its search-attribute index (``search``).
"""

from typing import Any

from celery_durable._moved import moved_attr

#: the names of the module this package replaced (issue 24), still found here
OLD_NAMES = frozenset({"SqliteStore", "from_url", "DEFAULT_BUSY_TIMEOUT", "DEFAULT_FILE_MODE"})
#: a star import binds them as it did
__all__ = sorted(OLD_NAMES)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, "celery_durable.stores.sqlite.store", OLD_NAMES)
