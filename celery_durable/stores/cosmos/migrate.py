"""Upgrading an existing Cosmos container in place (``celery -A proj durable cosmos …``, issue 16).

A container created by 0.1 (``create=true``) has the partition key ``/pk`` (version 2, the SDK's
default) and Cosmos' default indexing policy (every path indexed): it works, but a write costs
about twice the RU of the recommended policy. The indexing policy can be replaced on a live
container (Cosmos re-indexes in the background; reads and writes go on, queries on paths being
added may miss items until the transformation finishes): :func:`apply_indexing_policy`. The
partition key cannot be changed: that takes a new container and a copy (docs/azure/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_durable.stores.base import find_inner
from celery_durable.stores.cosmos.provision import (
    INDEXING_POLICY,
    PARTITION_KEY_PATH,
    container_problems,
    indexes_payloads,
)

if TYPE_CHECKING:
    from celery_durable.stores.cosmos.store import CosmosStore

__all__ = ["ContainerState", "inspect_container", "apply_indexing_policy"]

#: container properties a replace must carry over (the SDK resets what it is not given)
_KEPT = {
    "defaultTtl": "default_ttl",
    "conflictResolutionPolicy": "conflict_resolution_policy",
    "analyticalStorageTtl": "analytical_storage_ttl",
    "computedProperties": "computed_properties",
}


@dataclass
class ContainerState:
    """What the store thinks of an existing container."""

    database: str
    container: str
    partition_key: list[str]
    partition_key_version: int
    indexing_policy: dict[str, Any]
    problems: list[str] = field(default_factory=list)  # the store refuses to start on any of these
    indexes_payloads: bool = False  # works, but writes cost more RU than with the recommended policy

    @property
    def policy_is_recommended(self) -> bool:
        return _normal(self.indexing_policy) == _normal(INDEXING_POLICY)


def _normal(policy: dict[str, Any]) -> tuple[Any, ...]:
    """A policy without the fields Cosmos adds by itself (``indexes``, ``compositeIndexes: []``)."""

    def paths(key: str) -> frozenset[str]:
        return frozenset(str(p.get("path")) for p in policy.get(key) or [] if isinstance(p, dict))

    return (
        str(policy.get("indexingMode", "consistent")).lower(),
        policy.get("automatic", True) is not False,
        paths("includedPaths"),
        paths("excludedPaths"),
    )


def _unwrapped(store: Any) -> CosmosStore:
    """The Cosmos store itself: an engine's store may be wrapped (traced when a tracer provider
    is set, counted in tests), and the wrappers do not open clients."""
    found = find_inner(store, lambda s: hasattr(s, "_new_client"))
    return found if found is not None else store  # type: ignore[no-any-return]


def _open(store: CosmosStore) -> tuple[Any, Any, Any]:
    client = store._new_client()
    database = client.get_database_client(store.database)
    return client, database, database.get_container_client(store.container)


def _state(store: CosmosStore, props: dict[str, Any]) -> ContainerState:
    pk = props.get("partitionKey") or {}
    policy = dict(props.get("indexingPolicy") or {})
    return ContainerState(
        database=store.database,
        container=store.container,
        partition_key=list(pk.get("paths") or []),
        partition_key_version=int(pk.get("version") or 1),
        indexing_policy=policy,
        problems=container_problems(props, store.container),
        indexes_payloads=indexes_payloads(policy),
    )


def inspect_container(store: CosmosStore) -> ContainerState:
    """Read the container's properties (without the start-up check, which may refuse them)."""
    store = _unwrapped(store)
    client, _db, proxy = _open(store)
    try:
        return _state(store, dict(proxy.read()))
    finally:
        client.close()


def apply_indexing_policy(store: CosmosStore, *, dry_run: bool = False) -> tuple[ContainerState, ContainerState]:
    """Replace the container's indexing policy with :data:`INDEXING_POLICY` (in place, online).

    Returns the state before and after (equal with ``dry_run`` or when nothing had to change).
    The partition key is never touched: a container partitioned otherwise keeps its problem.
    """
    store = _unwrapped(store)
    from azure.cosmos import PartitionKey  # noqa: PLC0415 - the SDK is an optional dependency

    client, database, proxy = _open(store)
    try:
        props = dict(proxy.read())
        before = _state(store, props)
        if dry_run or before.policy_is_recommended:
            return before, before
        pk = props.get("partitionKey") or {}
        paths = list(pk.get("paths") or [PARTITION_KEY_PATH])
        kept = {arg: props[key] for key, arg in _KEPT.items() if props.get(key) is not None}
        database.replace_container(
            store.container,
            partition_key=PartitionKey(
                path=paths[0] if len(paths) == 1 else paths, version=int(pk.get("version") or 1)
            ),
            indexing_policy=INDEXING_POLICY,
            **kept,
        )
        return before, _state(store, dict(proxy.read()))
    finally:
        client.close()
