"""Containers created by 0.1 (issue 16): what start-up says, and the in-place indexing upgrade.

0.1 created its container with ``PartitionKey(path="/pk")`` (version 2, the SDK's default) and
Cosmos' default indexing policy (every path). Such a container works but costs about twice the RU
per write: the store starts, warns, and ``celery -A proj durable cosmos apply-policy`` replaces
the policy in place (data kept). What cannot be changed in place (the partition key) is refused
at start-up with the way out in the message.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.cosmos import CosmosClient, DatabaseProxy, PartitionKey
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner

from celery_durable.errors import ConfigurationError
from celery_durable.stores import store_from_url
from celery_durable.stores.cosmos.migrate import apply_indexing_policy, inspect_container
from celery_durable.stores.cosmos.provision import INDEXED_PATHS
from celery_durable.testing.cosmos_server import CosmosTestServer

pytestmark = pytest.mark.cosmos

DB = "upgrade_tests"


@pytest.fixture
def raw_db(cosmos_server: CosmosTestServer) -> Iterator[DatabaseProxy]:
    client = CosmosClient(cosmos_server.endpoint, credential=cosmos_server.key, connection_verify=False)
    yield client.create_database_if_not_exists(DB)
    client.close()


def _container(raw_db: DatabaseProxy, **make: Any) -> str:
    name = f"c{uuid.uuid4().hex[:12]}"
    raw_db.create_container(name, **make)
    return name


def test_a_0_1_container_starts_with_a_warning_naming_the_command(
    cosmos_server: CosmosTestServer, raw_db: DatabaseProxy, caplog: pytest.LogCaptureFixture
) -> None:
    name = _container(raw_db, partition_key=PartitionKey(path="/pk"))  # exactly what 0.1 created
    store = store_from_url(cosmos_server.url_for(DB, name, create=False))
    caplog.set_level(logging.WARNING, logger="celery_durable")
    store.create({"pk": "p", "id": "d"})  # it works ...
    store.close()
    warned = [r.getMessage() for r in caplog.records if "indexes every path" in r.getMessage()]
    assert len(warned) == 1, caplog.text  # ... and says what it costs and what to run
    assert "durable cosmos apply-policy" in warned[0]


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (
            {"partition_key": PartitionKey(path="/pk", version=2), "indexing_policy": {
                "includedPaths": [{"path": "/pk/?"}], "excludedPaths": [{"path": "/*"}]}},
            "durable cosmos apply-policy",
        ),
        ({"partition_key": PartitionKey(path="/pk", version=1)}, "cannot be changed: create a new container"),
        ({"partition_key": PartitionKey(path="/id")}, "docs/azure/README.md#moving-to-a-new-container"),
    ],
    ids=["missing-indexes", "pk-version-1", "pk-path"],
)  # fmt: skip
def test_start_up_errors_say_what_to_run_or_change(
    cosmos_server: CosmosTestServer, raw_db: DatabaseProxy, make: dict[str, Any], says: str
) -> None:
    store = store_from_url(cosmos_server.url_for(DB, _container(raw_db, **make), create=False))
    with pytest.raises(ConfigurationError) as info:
        store.read("p", "d")
    assert says in str(info.value)
    store.close()


def test_apply_policy_replaces_the_indexing_policy_in_place(
    cosmos_server: CosmosTestServer, raw_db: DatabaseProxy
) -> None:
    name = _container(
        raw_db,
        partition_key=PartitionKey(path="/pk", version=2),
        indexing_policy={"includedPaths": [{"path": "/pk/?"}], "excludedPaths": [{"path": "/*"}]},
        default_ttl=-1,  # carried over by the replace
    )
    raw_db.get_container_client(name).create_item({"pk": "p", "id": "kept", "v": 1})
    url = cosmos_server.url_for(DB, name, create=False)
    refused = store_from_url(url)
    with pytest.raises(ConfigurationError, match="does not index"):
        refused.read("p", "kept")
    refused.close()

    tool = store_from_url(url)
    before, after = apply_indexing_policy(tool, dry_run=True)
    assert before.problems and after == before  # a dry run changes nothing
    before, after = apply_indexing_policy(tool)
    assert before.problems and not after.problems and after.policy_is_recommended
    assert not inspect_container(tool).indexes_payloads
    tool.close()
    props = raw_db.get_container_client(name).read()
    assert {p["path"] for p in props["indexingPolicy"]["includedPaths"]} == set(INDEXED_PATHS)
    assert props.get("defaultTtl") == -1

    store = store_from_url(url)  # starts now, with the data it had
    assert store.read("p", "kept")["v"] == 1
    store.close()


def test_the_cli_checks_and_applies_the_policy(cosmos_server: CosmosTestServer, raw_db: DatabaseProxy) -> None:
    from tests.apps import basic

    name = _container(raw_db, partition_key=PartitionKey(path="/pk"))  # a 0.1 container
    basic.durable.configure(store=cosmos_server.url_for(DB, name, create=False))
    try:

        def cli(*args: str) -> Any:
            return CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "cosmos", *args])

        checked = cli("check")
        assert checked.exit_code == 0, checked.output
        assert "indexes every path" in checked.output and "(version 2)" in checked.output
        dry = cli("apply-policy", "--dry-run")
        assert dry.exit_code == 0 and "would replace" in dry.output, dry.output
        assert inspect_container(basic.durable.store).indexes_payloads  # type: ignore[arg-type]
        applied = cli("apply-policy", "--yes")
        assert applied.exit_code == 0 and "indexing policy replaced" in applied.output, applied.output
        again = cli("apply-policy", "--yes")
        assert "nothing to do" in again.output
        assert "indexing policy recommended" in cli("check").output
    finally:
        basic.durable.configure(store=None)


def test_the_cli_check_fails_on_a_container_the_store_refuses(
    cosmos_server: CosmosTestServer, raw_db: DatabaseProxy
) -> None:
    from tests.apps import basic

    name = _container(raw_db, partition_key=PartitionKey(path="/pk", version=1))
    basic.durable.configure(store=cosmos_server.url_for(DB, name, create=False))
    try:
        out = CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "cosmos", "check"])
    finally:
        basic.durable.configure(store=None)
    assert out.exit_code == 1 and "partition key version 1" in out.output and "cannot be changed" in out.output
