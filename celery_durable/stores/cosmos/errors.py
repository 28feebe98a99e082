"""Translate azure-cosmos / azure-core exceptions into the library's error tree (the boundary)."""

from __future__ import annotations

from collections.abc import Callable

from azure.core.exceptions import AzureError
from azure.cosmos import exceptions as cx

from celery_durable.errors import (
    ConfigurationError,
    ConflictError,
    DocumentTooLarge,
    StoreError,
    StoreUnavailable,
    Throttled,
)
from celery_durable.stores.base import Doc, doc_size
from celery_durable.stores.cosmos.config import server_message

__all__ = ["translate", "sdk_race", "TRANSIENT", "NOT_APPLIED"]

TRANSIENT = {408, 449, 500, 502, 503, 504}
NOT_APPLIED = {449, 503}  # the service did not run the request: safe to retry any write


def sdk_race(exc: BaseException) -> bool:
    """The SDK's own thread race: its endpoint cache (``_location_cache``: an OrderedDict it swaps
    while another thread's request iterates it, when it refreshes the account) raises this from
    inside a request of ours; the request was not sent yet. Transient: asked again, it goes."""
    return isinstance(exc, RuntimeError) and "mutated during iteration" in str(exc)


def translate(exc: Exception, what: str, doc: Doc | None, scrub: Callable[[str], str], max_doc_bytes: int) -> Exception:
    """The library error for an azure-cosmos / azure-core exception (never showing the key)."""
    status = getattr(exc, "status_code", None)
    if isinstance(exc, (cx.CosmosHttpResponseError, cx.CosmosBatchOperationError)) and status:
        sub = getattr(exc, "sub_status", None)
        short = scrub(server_message(exc))[:300]
        msg = f"cosmos {what}: HTTP {status}{f'.{sub}' if sub else ''}" + (f": {short}" if short else "")
        if status == 429:
            headers = getattr(exc, "headers", None) or {}
            after = headers.get("x-ms-retry-after-ms")
            return Throttled(msg, retry_after=float(after) / 1000 if after else None)
        if status == 413:
            size = doc_size(doc) if doc is not None else -1
            return DocumentTooLarge(str(doc["id"]) if doc is not None else what, size, max_doc_bytes)
        if status in (409, 412):
            return ConflictError(msg)
        if status == 404:  # document 404s are handled per operation: this is the container
            return StoreError(msg + " (does the database and container exist?)")
        if status in (401, 403):
            return ConfigurationError(msg)
        if status in TRANSIENT or status >= 500:
            return StoreUnavailable(msg)
        return StoreError(msg)
    if isinstance(exc, (AzureError, OSError)) or sdk_race(exc):
        return StoreUnavailable(f"cosmos {what}: {type(exc).__name__}: {scrub(str(exc))[:300]}")
    return StoreError(f"cosmos {what}: unexpected {type(exc).__name__}: {scrub(str(exc))[:300]}")
