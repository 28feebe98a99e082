"""The opt-in profile against a real Cosmos account (``DURABLE_TEST_COSMOS_URL``), proved in CI
by passing the test server's URL as if it were an account's (issue 16).

The contract suite run that way must use that URL (not start a test server of its own), give
every test a fresh database/container, delete them at the end, and never print the key, which
comes from ``DURABLE_COSMOS_KEY`` here (it may also be in the URL).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from azure.cosmos import CosmosClient

from celery_durable.stores import store_from_url
from celery_durable.testing.cosmos_server import CosmosTestServer
from harness.cosmos_account import COSMOS_URL_ENV, describe, fresh_container

pytestmark = pytest.mark.cosmos

REPO = Path(__file__).resolve().parents[2]


def _databases(server: CosmosTestServer) -> set[str]:
    client = CosmosClient(server.endpoint, credential=server.key, connection_verify=False)
    try:
        return {d["id"] for d in client.list_databases()}
    finally:
        client.close()


def _containers(server: CosmosTestServer, database: str) -> set[str]:
    client = CosmosClient(server.endpoint, credential=server.key, connection_verify=False)
    try:
        return {c["id"] for c in client.get_database_client(database).list_containers()}
    finally:
        client.close()


def test_the_contract_suite_runs_against_an_account_url(cosmos_server: CosmosTestServer) -> None:
    before = _databases(cosmos_server)
    cosmos_server.reset_stats()
    env = dict(os.environ)
    env[COSMOS_URL_ENV] = f"cosmos://{cosmos_server.host}:{cosmos_server.port}/?verify=false"  # no key in it
    env["DURABLE_COSMOS_KEY"] = cosmos_server.key
    picked = "read_missing_is_none or create_then_read_round_trips_json or first_writer_wins_across_threads"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "tests/stores/test_contract.py",
         "-m", "cosmos", "-k", picked],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "3 passed" in out, out[-3000:]
    assert cosmos_server.stats()["total"] > 0  # the run talked to "the account" ...
    created = _databases(cosmos_server) - before
    assert created == set(), f"left behind: {created}"  # ... and deleted the databases it made
    for form in (cosmos_server.key, quote(cosmos_server.key, safe="")):
        assert form not in out


def test_a_fresh_container_in_a_named_database_is_dropped_and_the_database_kept(
    cosmos_server: CosmosTestServer,
) -> None:
    url = f"cosmos://{cosmos_server.host}:{cosmos_server.port}/?verify=false&database=kept_db&key=" + quote(
        cosmos_server.key, safe=""
    )
    with fresh_container(url, prefix="x") as fresh:
        store = store_from_url(fresh)
        store.create({"pk": "p", "id": "d"})
        store.close()
        name = fresh.split("container=")[1].split("&")[0]
        assert name.startswith("x") and name in _containers(cosmos_server, "kept_db")
        assert cosmos_server.key not in describe(fresh) and "kept_db/" in describe(fresh)
    assert name not in _containers(cosmos_server, "kept_db")
    assert "kept_db" in _databases(cosmos_server)


def test_a_key_given_in_the_account_url_does_not_outlive_the_fresh_container(
    cosmos_server: CosmosTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it used to stay in $DURABLE_COSMOS_KEY, where it won over the key of every store built later
    from celery_durable.stores.cosmos.config import KEY_ENV

    monkeypatch.delenv(KEY_ENV, raising=False)
    url = f"cosmos://{cosmos_server.host}:{cosmos_server.port}/?verify=false&key=" + quote(cosmos_server.key, safe="")
    with fresh_container(url) as fresh:
        assert "key=" not in fresh and os.environ.get(KEY_ENV)  # used while the container lives
    assert KEY_ENV not in os.environ
