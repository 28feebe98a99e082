"""``find_inner``: the one walk through store wrappers (``.inner``) its four users share."""

from __future__ import annotations

from celery_durable.stores import store_from_url
from celery_durable.stores.base import find_inner, reads_may_lag
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.offload.store import Offloading, offloaded
from celery_durable.stores.push.base import NoPush
from celery_durable.stores.push.selection import build_notifier
from celery_durable.stores.traced import TracedStore
from celery_durable.testing.counting import CountingStore


def test_find_inner_walks_outermost_first_and_stops_at_the_end() -> None:
    backend = store_from_url("memory://")
    counting = CountingStore(backend)
    traced = TracedStore(counting)
    assert find_inner(traced, lambda s: True) is traced
    assert find_inner(traced, lambda s: isinstance(s, CountingStore)) is counting
    assert find_inner(traced, lambda s: isinstance(s, MemoryStore)) is backend
    assert find_inner(traced, lambda s: getattr(s, "inner", None) is None) is backend
    seen: list[object] = []
    assert find_inner(traced, lambda s: seen.append(s) or False) is None
    assert seen == [traced, counting, backend]


def test_offloaded_sets_the_max_payload_of_a_wrapped_offloading_store() -> None:
    backend = store_from_url("memory://")
    wrapped = TracedStore(CountingStore(backend))
    assert offloaded(wrapped, 12345) is wrapped
    assert not isinstance(wrapped, Offloading) and isinstance(backend, Offloading)
    assert backend.max_payload == 12345


def test_the_users_see_the_backend_through_wrappers() -> None:
    wrapped = TracedStore(CountingStore(store_from_url("memory://")))
    assert reads_may_lag(wrapped) is False  # the wrappers' session_token methods are not the backend's
    assert isinstance(build_notifier("auto", wrapped, None, {"completed"}), NoPush)
