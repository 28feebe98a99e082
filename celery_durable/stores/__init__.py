"""Storage backends behind one contract (docs/architecture.md §4), chosen by URL scheme.

``sqlite:///path/to/file.db`` (the embedded default), ``postgresql://...``, ``cosmos://...`` and ``memory://``
(engine unit tests only). Like Celery's backend alias table, third parties can register a
scheme with :func:`register_backend`.
"""

from __future__ import annotations

import importlib
from typing import Any

from celery_durable.errors import ConfigurationError
from celery_durable.stores.base import MAX_BATCH_OPS, MAX_DOC_BYTES, Doc, DueRef, Op, PartitionRead, Rewrite, Store
from celery_durable.stores.offload.store import DEFAULT_MAX_PAYLOAD, offloaded

__all__ = [
    "Store",
    "Doc",
    "Op",
    "Rewrite",
    "DueRef",
    "PartitionRead",
    "MAX_DOC_BYTES",
    "MAX_BATCH_OPS",
    "BACKEND_ALIASES",
    "register_backend",
    "store_from_url",
]

#: URL scheme -> "module:factory"; the factory takes ``(url, **options)``.
BACKEND_ALIASES: dict[str, str] = {
    "memory": "celery_durable.stores.memory:from_url",
    "sqlite": "celery_durable.stores.sqlite.store:from_url",
    "cosmos": "celery_durable.stores.cosmos.store:from_url",
    "cosmoss": "celery_durable.stores.cosmos.store:from_url",
    "postgresql": "celery_durable.stores.postgres.store:from_url",
    "postgres": "celery_durable.stores.postgres.store:from_url",
}


def register_backend(scheme: str, target: str) -> None:
    """Map a URL scheme to ``"module:factory"``."""
    BACKEND_ALIASES[scheme] = target


def store_from_url(url: str, *, max_payload: int | None = None, **options: Any) -> Store:
    """Build a store from a URL such as ``sqlite:///var/lib/app/durable.db``.

    Every backend gets :class:`~.offload.Offloading` mixed in: documents over the item limit
    (2 MB) are stored as chunk documents, up to ``max_payload`` bytes (default 64 MiB).
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    target = BACKEND_ALIASES.get(scheme)
    if target is None:
        known = ", ".join(sorted(BACKEND_ALIASES))
        raise ConfigurationError(f"unknown store URL scheme {scheme!r} (known: {known})")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # e.g. azure-cosmos not installed
        raise ConfigurationError(f"store backend {scheme!r} is not available: {exc}") from exc
    factory = getattr(module, attr)
    store: Store = factory(url, **options)
    return offloaded(store, DEFAULT_MAX_PAYLOAD if max_payload is None else max_payload)
