"""Fixtures of the store contract suite: one ``store`` per backend.

``memory``, ``sqlite`` and ``postgres`` always run (``postgres``: a fresh schema per test, from
``tests/plugins/postgres.py``; the shared-store tests reach it through a pausable proxy, for the
outage test); ``cosmos`` asks for the ``cosmos_url`` fixture of
``tests/plugins/cosmos_server.py`` (a fresh empty container per test) only when that parameter
is selected, so ``-m "not cosmos"`` runs without the Cosmos test server.

``DURABLE_TEST_COSMOS_URL`` (a ``cosmos://`` store URL of a real account or the official emulator;
the key may come from ``DURABLE_COSMOS_KEY``) replaces the test server: every test gets a fresh
container named ``t<random>`` in that URL's database, or in a fresh database when the URL names
none (dropped afterwards: ``harness.cosmos_account``), e.g.::

    DURABLE_TEST_COSMOS_URL='cosmos://acct.documents.azure.com/?database=durable_tests&container=x' \
        pytest tests/stores -m cosmos
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celery_durable.stores import Store, store_from_url
from harness import cosmos_account
from tests.plugins.postgres import (  # noqa: F401 - fixtures
    _postgres_server,
    postgres_proxied_url,
    postgres_proxy,
    postgres_schema,
    postgres_url,
)

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres"),
    pytest.param("cosmos", id="cosmos", marks=pytest.mark.cosmos),
]
#: backends whose stores several processes can share (the same URL opens the same data)
SHARED_BACKENDS = [p for p in BACKENDS if p.values[0] != "memory"]


#: A real Cosmos DB account (or the official emulator) to run the ``cosmos`` parameter against
COSMOS_URL_ENV = cosmos_account.COSMOS_URL_ENV


def _real_cosmos_url(request: pytest.FixtureRequest) -> str:
    """The env URL with a fresh container (deleted when the test ends)."""
    fresh = cosmos_account.fresh_container(os.environ[COSMOS_URL_ENV])
    url = fresh.__enter__()
    request.addfinalizer(lambda: fresh.__exit__(None, None, None))
    return url


def _url_for(request: pytest.FixtureRequest, backend: str, tmp_path: Path, shared: bool = False) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        # tmp_path is absolute, so this is the sqlite:////abs/path form
        return f"sqlite:///{tmp_path / 'store.db'}"
    if backend == "postgres":
        pg: str = request.getfixturevalue("postgres_proxied_url" if shared else "postgres_url")
        return pg
    if backend == "cosmos":
        if os.environ.get(COSMOS_URL_ENV):
            return _real_cosmos_url(request)
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


def _handles(url: str, store: Store) -> Iterator[Callable[[], Store]]:
    """Open other handles on ``store``'s data (for ``memory``: the same object); closed after."""
    opened: list[Store] = []

    def open_() -> Store:
        if url.startswith("memory:"):
            return store
        s = store_from_url(url)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


@pytest.fixture
def other_handle(store_url: str, store: Store) -> Iterator[Callable[[], Store]]:
    """Open another handle on the same data (for ``memory``: the same object)."""
    yield from _handles(store_url, store)


@pytest.fixture(params=SHARED_BACKENDS)
def shared_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of a fresh store that several processes can open (sqlite, postgres, cosmos)."""
    return _url_for(request, request.param, tmp_path, shared=True)


# -- the breaks' stores (test_*_breaks.py): memory, SQLite and Cosmos, and a second handle on one --
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
    yield from _handles(adv_store_url, adv_store)
