"""Large documents offloaded into chunk documents of their partition: the wrapper store
(``store``), chunk ids and manifests (``chunks``) and the collector of orphan chunks (``chunk_gc``).
"""

from typing import Any

from celery_durable._moved import moved_attr

#: the names of the module this package replaced (issue 24), still found here
OLD_NAMES = frozenset(
    {
        "Offloading",
        "offloaded",
        "DEFAULT_MAX_PAYLOAD",
        "CHUNK_PREFIX",
        "MANIFEST_KEY",
        "DUE_CHUNK",
        "CHUNK_GRACE",
        "inline_limit",
    }
)
#: a star import binds them as it did
__all__ = sorted(OLD_NAMES)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, "celery_durable.stores.offload.store", OLD_NAMES)
