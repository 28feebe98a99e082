"""The Cosmos store as Azure runs it (issue 16): batch size, deadlines, provisioning, hot partitions.

Against the Cosmos test server (celery_durable/testing/cosmos_server.js), which enforces the 2 MB
request limit of a transactional batch and can delay its answers (a stalled service).
"""

from __future__ import annotations

import json
import re
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.cosmos import CosmosClient, DatabaseProxy, PartitionKey
from azure.cosmos import exceptions as cx
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable.errors import ConfigurationError, StoreUnavailable
from celery_durable.stores import DueRef, Store, store_from_url
from celery_durable.stores.base import doc_size
from celery_durable.stores.cosmos.index import shard_of
from celery_durable.stores.cosmos.provision import INDEXED_PATHS, INDEXING_POLICY, check_container
from celery_durable.stores.cosmos.store import CosmosStore
from celery_durable.testing.cosmos_server import CosmosTestServer
from celery_durable.testing.env import WorkflowEnvironment

MB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def sized(pk: str, doc_id: str, size: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"pk": pk, "id": doc_id, "blob": ""}
    doc["blob"] = "x" * (size - doc_size(doc))
    return doc


def cosmos(store: Store) -> CosmosStore:
    assert isinstance(store, CosmosStore)
    return store


@pytest.fixture
def raw_db(cosmos_server: CosmosTestServer) -> Iterator[DatabaseProxy]:
    """The SDK without our store, to prepare containers the store then meets."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = CosmosClient(cosmos_server.endpoint, credential=cosmos_server.key, connection_verify=False)
        yield client.create_database_if_not_exists("azure_checks")
        client.close()


# --- 2. transactional batch size ---------------------------------------------------------------


@pytest.mark.cosmos
def test_the_test_server_refuses_a_batch_over_2_mb(cosmos_url: str) -> None:
    store = cosmos(store_from_url(cosmos_url))
    store.create({"pk": "p", "id": "warm"})
    c = store._container()
    ops: list[tuple[Any, ...]] = [
        ("create", (sized("p", "a", int(1.5 * MB)),)),
        ("create", (sized("p", "b", int(1.5 * MB)),)),
    ]
    with pytest.raises((cx.CosmosHttpResponseError, cx.CosmosBatchOperationError)) as info:
        c.execute_item_batch(ops, partition_key="p")
    assert info.value.status_code == 413
    assert store.read("p", "a") is None and store.read("p", "b") is None
    store.close()


durable_tests = Durable(Celery("cosmos-azure", set_as_current=False), store="memory://")


@durable_activity(name="tests.cosmos_azure.echo")
def echo(data: str) -> str:
    return data + "!"


@durable_tests.workflow(name="tests.cosmos_azure.big_in_big_out")
def big_in_big_out(data: str) -> str:
    return echo(data)


@pytest.mark.cosmos
def test_a_workflow_with_a_1_1_mb_input_and_a_1_1_mb_result_completes_on_cosmos(
    cosmos_server: CosmosTestServer, cosmos_url: str
) -> None:
    store = store_from_url(cosmos_url)
    env = WorkflowEnvironment(durable_tests, store=store)
    data = "d" * int(1.1 * MB)
    handle = env.start(big_in_big_out, data)
    assert env.result(handle) == data + "!"
    store.close()


# --- 3. deadlines ------------------------------------------------------------------------------


@pytest.mark.cosmos
@pytest.mark.parametrize("call", ["read", "create", "query_partition", "batch"])
def test_a_stalled_call_fails_with_store_unavailable_within_the_deadline(
    cosmos_server: CosmosTestServer, cosmos_url: str, call: str
) -> None:
    store = store_from_url(cosmos_url, deadline=2.0)
    store.create({"pk": "p", "id": "there"})  # connected
    # every document request is answered only after 30 s (a hung service)
    cosmos_server.inject_fault(0, delay_ms=30_000, count=50, match="/docs")
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable, match="deadline"):
        if call == "read":
            store.read("p", "there")
        elif call == "create":
            store.create({"pk": "p", "id": "new"})
        elif call == "query_partition":
            store.query_partition("p")
        else:
            from celery_durable.stores import Op

            store.batch("p", [Op.create({"pk": "p", "id": "b"})])
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0 + 1.0, elapsed
    cosmos_server.clear_faults()
    store.close()


@pytest.mark.cosmos
def test_throttling_waits_no_longer_than_the_deadline(cosmos_server: CosmosTestServer, cosmos_url: str) -> None:
    store = store_from_url(cosmos_url, deadline=2.0)
    store.create({"pk": "p", "id": "there"})
    cosmos_server.inject_fault(429, count=100, retry_after_ms=1500, match="/docs")
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable):  # Throttled is a StoreUnavailable
        store.read("p", "there")
    assert time.monotonic() - t0 < 2.0 + 1.5
    cosmos_server.clear_faults()
    store.close()


def test_deadline_and_timeouts_are_options() -> None:
    store = cosmos(store_from_url("cosmos://h:1/?database=d&container=c&key=k&deadline=3&read_timeout=2.5"))
    assert store.deadline.seconds == 3.0 and store._read_timeout == 2.5
    default = cosmos(store_from_url("cosmos://h:1/?database=d&container=c&key=k"))
    assert default.deadline.seconds == 10.0 and default._read_timeout == 10.0  # not the SDK's 65 s
    assert default._throttle[1] <= 10  # the SDK's 429 waits end within the deadline
    with pytest.raises(ConfigurationError, match="deadline"):
        store_from_url("cosmos://h:1/?database=d&container=c&key=k&deadline=0")


# --- 4. provisioning ---------------------------------------------------------------------------


@pytest.mark.cosmos
def test_a_created_container_gets_the_recommended_indexing_policy(raw_db: DatabaseProxy, cosmos_url: str) -> None:
    store = cosmos(store_from_url(cosmos_url))
    store.create({"pk": "p", "id": "d"})
    props = store._container().read()
    assert props["partitionKey"]["paths"] == ["/pk"] and props["partitionKey"].get("version") == 2
    policy = props["indexingPolicy"]
    assert {p["path"] for p in policy["includedPaths"]} == set(INDEXED_PATHS)
    assert {"path": "/*"} in policy["excludedPaths"]
    store.close()


@pytest.mark.cosmos
@pytest.mark.parametrize(
    ("make", "message"),
    [
        ({"partition_key": PartitionKey(path="/id")}, r"partitioned by \['/id'\]"),
        ({"partition_key": PartitionKey(path="/pk", version=1)}, "partition key version 1"),
        (
            {
                "partition_key": PartitionKey(path="/pk", version=2),
                "indexing_policy": {"includedPaths": [{"path": "/pk/?"}], "excludedPaths": [{"path": "/*"}]},
            },
            re.escape("does not index /id/?, /_ts/?, /at/?"),
        ),
        (
            {
                "partition_key": PartitionKey(path="/pk", version=2),
                "indexing_policy": {"indexingMode": "none", "automatic": False},
            },
            "consistent, automatic indexing",
        ),
    ],
    ids=["pk-path", "pk-version-1", "missing-indexes", "no-indexing"],
)
def test_an_existing_container_is_checked_at_start_up(
    cosmos_server: CosmosTestServer, raw_db: DatabaseProxy, make: dict[str, Any], message: str
) -> None:
    name = f"c{uuid.uuid4().hex[:12]}"
    raw_db.create_container(name, **make)
    store = store_from_url(cosmos_server.url_for("azure_checks", name, create=False))
    with pytest.raises(ConfigurationError, match=message):
        store.read("p", "d")
    store.close()


@pytest.mark.cosmos
def test_an_existing_container_with_the_default_or_recommended_policy_is_accepted(
    cosmos_server: CosmosTestServer, raw_db: DatabaseProxy
) -> None:
    for policy in (None, INDEXING_POLICY):
        name = f"c{uuid.uuid4().hex[:12]}"
        raw_db.create_container(name, partition_key=PartitionKey(path="/pk", version=2), indexing_policy=policy)
        store = store_from_url(cosmos_server.url_for("azure_checks", name, create=False))
        store.create({"pk": "p", "id": "d", "due_kind": "k", "due_at": 1.0})
        assert store.scan_due("k", 2.0) == [DueRef("p", "d", 1.0)]
        store.close()


@pytest.mark.cosmos
def test_throughput_options_on_create(cosmos_server: CosmosTestServer) -> None:
    for extra in ({"throughput": 400}, {"autoscale_max": 4000}):
        store = store_from_url(cosmos_server.url_for("durable_tests", f"c{uuid.uuid4().hex[:12]}", **extra))
        assert store.create({"pk": "p", "id": "d"}) is not None
        store.close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("throughput=400&autoscale_max=4000", "not both"),
        ("throughput=450", "multiple of 100"),
        ("autoscale_max=500", "multiple of 1000"),
        ("due_shards=0", "due_shards"),
    ],
)
def test_bad_provisioning_options_are_refused(query: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        store_from_url(f"cosmos://h:1/?database=d&container=c&key=k&{query}")


def test_check_container_rules() -> None:
    ok = {"partitionKey": {"paths": ["/pk"], "version": 2}, "indexingPolicy": INDEXING_POLICY}
    check_container(ok, "c")
    check_container({"partitionKey": {"paths": ["/pk"], "version": 2}}, "c")  # Cosmos' default: all paths
    only_at_excluded = {
        **ok,
        "indexingPolicy": {"includedPaths": [{"path": "/*"}], "excludedPaths": [{"path": "/at/?"}]},
    }
    with pytest.raises(ConfigurationError, match=re.escape("/at/?")):
        check_container(only_at_excluded, "c")
    with pytest.raises(ConfigurationError, match="version 1"):
        check_container({"partitionKey": {"paths": ["/pk"]}}, "c")  # no version: version 1


def test_the_shipped_templates_match_the_policy() -> None:
    shipped = json.loads((ROOT / "docs" / "azure" / "indexing-policy.json").read_text())
    assert shipped == INDEXING_POLICY
    bicep = (ROOT / "docs" / "azure" / "cosmos.bicep").read_text()
    for path in INDEXED_PATHS:
        assert f"'{path}'" in bicep
    assert "'/pk'" in bicep and "version: 2" in bicep


# --- 5. hot partitions -------------------------------------------------------------------------


@pytest.mark.cosmos
def test_due_entries_of_one_minute_spread_over_shards_and_scans_find_them_all(cosmos_url: str) -> None:
    store = cosmos(store_from_url(cosmos_url))
    at = float(int(time.time()) // 60 * 60 + 30)  # one bucket
    for i in range(40):
        store.create({"pk": f"wf-{i}", "id": "exec", "due_kind": "lease", "due_at": at})
    c = store._container()
    entry_pks = [
        str(v)
        for v in c.query_items("SELECT VALUE c.pk FROM c WHERE c._ix = 'lease'", enable_cross_partition_query=True)
    ]
    assert len(entry_pks) == 40
    bucket = int(at // 60)
    assert set(entry_pks) <= {f"_due:lease:{bucket}:{s}" for s in range(4)}
    assert len(set(entry_pks)) == 4  # 40 partitions hashed over 4 shards: every shard used
    for i in range(40):
        assert f"_due:lease:{bucket}:{shard_of(f'wf-{i}', 4)}" in entry_pks
    got = store.scan_due("lease", at + 1, limit=1000)
    assert sorted(r.pk for r in got) == sorted(f"wf-{i}" for i in range(40))
    store.close()


@pytest.mark.cosmos
def test_one_shard_keeps_the_unsharded_layout(cosmos_url: str) -> None:
    store = cosmos(store_from_url(cosmos_url, due_shards=1))
    at = float(int(time.time()) // 60 * 60 + 30)
    store.create({"pk": "wf", "id": "exec", "due_kind": "lease", "due_at": at})
    pks: list[Any] = list(
        store._container().query_items(
            "SELECT VALUE c.pk FROM c WHERE c._ix = 'lease'", enable_cross_partition_query=True
        )
    )
    assert pks == [f"_due:lease:{int(at // 60)}"]
    assert store.scan_due("lease", at) == [DueRef("wf", "exec", at)]
    store.close()


# --- 6. operator reads -------------------------------------------------------------------------


@pytest.mark.cosmos
def test_scan_partitions_pages_up_to_the_limit(cosmos_server: CosmosTestServer, cosmos_url: str) -> None:
    store = cosmos(store_from_url(cosmos_url))
    for i in range(7):
        store.create({"pk": f"run-{i}", "id": "exec"})
    assert store.scan_partitions("run-", limit=5) == [f"run-{i}" for i in range(5)]
    assert store.scan_partitions("run-") == [f"run-{i}" for i in range(7)]
    store.close()
