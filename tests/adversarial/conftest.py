"""Fixtures of the adversarial store tests: ``adv_store`` (memory, SQLite, Cosmos) and ``adv_other_handle``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celery_durable.stores import Store, store_from_url


@pytest.fixture(params=["memory", "sqlite", pytest.param("cosmos", marks=pytest.mark.cosmos)])
def adv_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue("cosmos_url")
    return url


@pytest.fixture
def adv_store(adv_store_url: str) -> Iterator[Store]:
    s = store_from_url(adv_store_url)
    yield s
    s.close()


@pytest.fixture
def adv_other_handle(adv_store_url: str, adv_store: Store) -> Iterator[Callable[[], Store]]:
    """Another handle on the same data (for memory: the same object)."""
    opened: list[Store] = []

    def open_() -> Store:
        if adv_store_url == "memory://":
            return adv_store
        s = store_from_url(adv_store_url)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()
