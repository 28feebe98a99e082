"""Pytest fixtures for the Cosmos DB test server (celery_durable.testing.cosmos_server).

``cosmos_server``: one started :class:`CosmosTestServer` for the session (stopped at the end).
``cosmos_url``: a ``cosmos://`` URL of a fresh, empty, uniquely named container.

If Node/npm are missing or the server cannot start, tests using these fixtures are skipped with
the reason, except in CI (``CI=true``) where they fail: a green CI run must mean Cosmos ran.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from celery_durable.testing.cosmos_server import CosmosServerError, CosmosTestServer


def pytest_configure(config: pytest.Config) -> None:
    # The test server's certificate is self-signed, so stores use verify=false. The store silences
    # urllib3's warning for that host when it is built, but pytest resets warning filters per test
    # while the SDK's background health-check threads may still open connections: filter here too.
    config.addinivalue_line(
        "filterwarnings",
        r"ignore:Unverified HTTPS request is being made to host '127\.0\.0\.1'"
        ":urllib3.exceptions.InsecureRequestWarning",
    )


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"Cosmos test server unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"Cosmos test server unavailable: {reason}")


@pytest.fixture(scope="session")
def _cosmos_server_session() -> Iterator[CosmosTestServer | str]:
    # The outcome (server or failure reason) is cached for the session so a failed start is
    # reported once per test, not retried by every test.
    server = CosmosTestServer()
    try:
        server.start()
    except CosmosServerError as exc:
        yield str(exc)
        return
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cosmos_server(_cosmos_server_session: CosmosTestServer | str) -> CosmosTestServer:
    """The session's running Cosmos test server."""
    if isinstance(_cosmos_server_session, str):
        _unavailable(_cosmos_server_session)
    assert isinstance(_cosmos_server_session, CosmosTestServer)
    if not _cosmos_server_session.running:  # a test stopped it: bring it back (empty)
        _cosmos_server_session.start()
    return _cosmos_server_session


@pytest.fixture
def cosmos_url(cosmos_server: CosmosTestServer) -> Iterator[str]:
    """URL of a fresh container (the store creates it on first use); faults cleared afterwards."""
    yield cosmos_server.url_for("durable_tests", f"c{uuid.uuid4().hex[:16]}")
    if cosmos_server.running:
        cosmos_server.clear_faults()
        cosmos_server.resume()
