"""Tests and benchmarks against a real Cosmos DB account or the official emulator (opt-in, issue 16).

``DURABLE_TEST_COSMOS_URL`` is a ``cosmos://`` store URL of the account; the key is in it
(``key=``) or in ``DURABLE_COSMOS_KEY``. Every user of it gets a fresh container (and, unless
the URL names a ``database=``, a fresh database), deleted when done, so runs never see each
other's data and leave nothing behind that costs RU/s. The key is never printed: only
:func:`describe` output (endpoint, database, container) is, and a fresh container's URL has
no ``key=`` (a key in the account URL moves to ``DURABLE_COSMOS_KEY``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["COSMOS_URL_ENV", "account_url", "describe", "fresh_container", "drop_container"]

log = logging.getLogger("harness.cosmos_account")

#: the environment variable naming the account (a ``cosmos://`` store URL)
COSMOS_URL_ENV = "DURABLE_TEST_COSMOS_URL"


def account_url() -> str | None:
    """The account URL of the environment, or ``None`` (then the Cosmos test server is used)."""
    return os.environ.get(COSMOS_URL_ENV) or None


def _with(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True)) | params
    return urlunsplit(parts._replace(query=urlencode(query)))


def _param(url: str, name: str) -> str | None:
    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True)).get(name)


def _keyless(url: str) -> str:
    """``url`` without ``key=``, which moves to ``$DURABLE_COSMOS_KEY`` (that wins over a URL key
    anyway, so an env key already set is kept). The fresh URL is a fixture value, and pytest
    prints the fixture values of a failing test: the key must not be in it."""
    from celery_durable.stores.cosmos.config import KEY_ENV  # noqa: PLC0415 - as drop_container

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    key = dict(query).get("key")
    if key is None:
        return url
    os.environ.setdefault(KEY_ENV, key.replace(" ", "+"))  # an unencoded base64 "+" reads as a space
    return urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "key"])))


def describe(url: str) -> str:
    """``host database/container`` of a store URL: what may be printed (never the key)."""
    return f"{urlsplit(url).hostname} {_param(url, 'database')}/{_param(url, 'container')}"


def drop_container(url: str, *, database_too: bool = False) -> None:
    """Delete the URL's container (or its whole database); best effort, never raises."""
    from celery_durable.stores.cosmos.store import from_url  # noqa: PLC0415 - the azure SDK is optional

    try:
        store: Any = from_url(url)
    except Exception:  # noqa: BLE001 - a URL that cannot even build a store has nothing to drop
        return
    client = None
    try:
        client = store._new_client()
        if database_too:
            client.delete_database(store.database)
        else:
            client.get_database_client(store.database).delete_container(store.container)
    except Exception as exc:  # noqa: BLE001 - a leftover is reported, not fatal
        log.warning("could not delete the test container %s: %s", describe(url), type(exc).__name__)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        store.close()


@contextlib.contextmanager
def fresh_container(url: str, prefix: str = "t") -> Iterator[str]:
    """``url`` with a new container name (and a new database unless it names one); both deleted
    on exit (the database only when made up here)."""
    own_database = not _param(url, "database")
    name = uuid.uuid4().hex[:16]
    params = {"container": f"{prefix}{name}", "create": "true"}
    if own_database:
        params["database"] = f"durable_tests_{name}"
    from celery_durable.stores.cosmos.config import KEY_ENV  # noqa: PLC0415 - as drop_container

    # _keyless may move the key into the environment: put it back as it was on exit, so a key
    # given for this account never leaks into stores built later in the process
    before = os.environ.get(KEY_ENV)
    fresh = _with(_keyless(url), **params)
    try:
        yield fresh
    finally:
        try:
            drop_container(fresh, database_too=own_database)
        finally:
            if before is None:
                os.environ.pop(KEY_ENV, None)
            else:
                os.environ[KEY_ENV] = before
