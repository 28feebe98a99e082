"""Fixtures of the store contract suite: one ``store`` per backend.

``memory`` and ``sqlite`` always run; ``cosmos`` asks for the ``cosmos_url`` fixture of
``tests/plugins/cosmos_server.py`` (a fresh empty container per test) only when that parameter
is selected, so ``-m "not cosmos"`` runs without the Cosmos test server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celery_durable.stores import Store, store_from_url

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("cosmos", id="cosmos", marks=pytest.mark.cosmos),
]
#: backends whose stores several processes can share (the same URL opens the same data)
SHARED_BACKENDS = [p for p in BACKENDS if p.values[0] != "memory"]


def _url_for(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        # tmp_path is absolute, so this is the sqlite:////abs/path form
        return f"sqlite:///{tmp_path / 'store.db'}"
    if backend == "cosmos":
        url: str = request.getfixturevalue("cosmos_url")
        return url
    raise AssertionError(f"unknown backend {backend!r}")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def store_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """URL of a fresh, empty store of the backend under test."""
    return _url_for(request, backend, tmp_path)


@pytest.fixture
def store(backend: str, store_url: str) -> Iterator[Store]:
    s = store_from_url(store_url)
    yield s
    s.close()


@pytest.fixture
def other_handle(backend: str, store_url: str, store: Store) -> Iterator[Callable[[], Store]]:
    """Open another handle on the same data (for ``memory``: the same object)."""
    opened: list[Store] = []

    def open_() -> Store:
        if backend == "memory":
            return store
        s = store_from_url(store_url)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


@pytest.fixture(params=SHARED_BACKENDS)
def shared_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of a fresh store that several processes can open (sqlite, cosmos)."""
    return _url_for(request, request.param, tmp_path)
