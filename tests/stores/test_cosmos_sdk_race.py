"""The azure-cosmos SDK's own thread race (its endpoint cache, an OrderedDict it swaps while
another thread's request iterates it) surfaced as ``StoreError("... unexpected RuntimeError:
OrderedDict mutated during iteration")`` from a read, failing a collector racing writers
(tests/stores/test_contract_chunk_gc.py, once in a full run). A read that meets it is asked again;
anything else still meeting it is a StoreUnavailable (transient), never a StoreError."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable.errors import StoreUnavailable
from celery_durable.stores import store_from_url
from celery_durable.stores.cosmos.errors import sdk_race, translate

pytestmark = pytest.mark.cosmos


def test_a_read_meeting_the_sdks_race_is_asked_again(cosmos_url: str) -> None:
    store = store_from_url(cosmos_url)
    try:
        store.create({"pk": "p", "id": "a", "type": "t"})
        container = store._container()  # type: ignore[attr-defined]
        real = container.query_items
        raced: list[int] = []

        def racing(*args: Any, **kwargs: Any) -> Any:
            pages = real(*args, **kwargs).by_page()

            class Pager:
                def by_page(self) -> Any:
                    return self

                def __iter__(self) -> Any:
                    return self

                def __next__(self) -> Any:
                    if not raced:
                        raced.append(1)
                        raise RuntimeError("OrderedDict mutated during iteration")
                    return next(pages)

            return Pager()

        container.query_items = racing
        assert [d and d["id"] for d in store.read_many("p", ["a", "b"])] == ["a", None]
        assert raced == [1]
    finally:
        store.close()


def test_the_race_is_transient_where_it_is_not_retried() -> None:
    exc = RuntimeError("OrderedDict mutated during iteration")
    assert sdk_race(exc) and not sdk_race(RuntimeError("other"))
    assert isinstance(translate(exc, "write", None, str, 1), StoreUnavailable)
