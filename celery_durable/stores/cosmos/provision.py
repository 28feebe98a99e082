"""Provisioning of the Cosmos store's container: throughput, indexing policy, start-up check.

With ``create=true`` the store creates its container with :data:`INDEXING_POLICY` (only the paths
its queries filter or sort on are indexed: writes then cost ~5–6 RU/KB instead of ~10+ with
Cosmos' default "index every path") and the throughput asked for (``throughput=`` manual RU/s or
``autoscale_max=`` autoscale maximum RU/s; neither: the account default, or the database's shared
throughput). An existing container, created by the store or by a template
(``docs/azure/cosmos.bicep``), is checked on first use by :func:`check_container`.
"""

from __future__ import annotations

import logging
from typing import Any

from celery_durable.errors import ConfigurationError

__all__ = [
    "INDEXING_POLICY",
    "INDEXED_PATHS",
    "PARTITION_KEY_PATH",
    "check_container",
    "container_problems",
    "indexes_payloads",
    "throughput_option",
]

PARTITION_KEY_PATH = "/pk"

#: Every path the store's queries filter or sort on (``store.py``, ``read.py``,
#: ``listing.py``): ``pk``/``_ts`` (query_partition, read_many, scan_partitions), ``id``
#: (read_many, listings), ``at`` (a due bucket's entries, oldest first), ``_ix``/``b`` (the next
#: non-empty bucket), ``workflow``/``status``/``created_at`` (list_execs, newest first).
INDEXED_PATHS = (
    "/pk/?",
    "/id/?",
    "/_ts/?",
    "/at/?",
    "/_ix/?",
    "/b/?",
    "/workflow/?",
    "/status/?",
    "/created_at/?",
)

#: The recommended indexing policy (also in docs/azure/indexing-policy.json and the Bicep template).
INDEXING_POLICY: dict[str, Any] = {
    "indexingMode": "consistent",
    "automatic": True,
    "includedPaths": [{"path": p} for p in INDEXED_PATHS],
    "excludedPaths": [{"path": "/*"}, {"path": '/"_etag"/?'}],
}


def throughput_option(throughput: int | None, autoscale_max: int | None) -> Any:
    """The ``offer_throughput`` argument of ``create_container`` (``None``: the default)."""
    if throughput is not None and autoscale_max is not None:
        raise ConfigurationError("cosmos store: give throughput= (manual RU/s) or autoscale_max=, not both")
    if throughput is not None:
        if isinstance(throughput, bool) or throughput < 400 or throughput % 100:
            raise ConfigurationError(
                f"cosmos throughput must be a multiple of 100 RU/s, at least 400; got {throughput}"
            )
        return throughput
    if autoscale_max is not None:
        if isinstance(autoscale_max, bool) or autoscale_max < 1000 or autoscale_max % 1000:
            raise ConfigurationError(
                f"cosmos autoscale_max must be a multiple of 1000 RU/s, at least 1000; got {autoscale_max}"
            )
        from azure.cosmos import ThroughputProperties  # noqa: PLC0415 - only when asked for

        return ThroughputProperties(auto_scale_max_throughput=autoscale_max)
    return None


def _indexed(path: str, policy: dict[str, Any]) -> bool:
    """Whether ``path`` (``/a/?``) is indexed under ``policy``: the most specific rule wins
    (``/a/?`` over ``/a/*`` over ``/*``), as in Cosmos."""
    included = {str(p.get("path")) for p in policy.get("includedPaths") or [] if isinstance(p, dict)}
    excluded = {str(p.get("path")) for p in policy.get("excludedPaths") or [] if isinstance(p, dict)}
    prefix = path[: -len("?")]
    for rule in (path, prefix + "*", "/*"):
        if rule in excluded:
            return False
        if rule in included:
            return True
    return not excluded and not included  # no rule at all: Cosmos indexes everything


#: what to run to replace a container's indexing policy in place (cli/cosmos.py)
APPLY_POLICY = "celery -A <proj> durable cosmos apply-policy"
#: where the partition key migration is described
PK_MIGRATION = "docs/azure/README.md#moving-to-a-new-container"

log = logging.getLogger("celery_durable.stores.cosmos")


def indexes_payloads(policy: dict[str, Any]) -> bool:
    """Whether ``policy`` indexes paths the store never queries (Cosmos' default "every path",
    as 0.1 created containers): it works, but every write costs more RU."""
    return _indexed("/input/?", policy) or _indexed("/result/?", policy)


def container_problems(props: dict[str, Any], container: str) -> list[str]:
    """What keeps the store from working on this container, each saying what to do."""
    problems: list[str] = []
    pk = props.get("partitionKey") or {}
    paths = pk.get("paths") or []
    new_container = (
        "the partition key of a container cannot be changed: create a new container (create=true with "
        "another container= name, or docs/azure/cosmos.bicep) and move the data to it, see " + PK_MIGRATION
    )
    if paths != [PARTITION_KEY_PATH]:
        problems.append(
            f"cosmos container {container!r} is partitioned by {paths}, expected [{PARTITION_KEY_PATH!r}]; "
            + new_container
        )
    elif int(pk.get("version") or 1) < 2:
        problems.append(
            f"cosmos container {container!r} has partition key version 1 (keys hashed on their first "
            "100 bytes; execution ids can be longer): it needs version 2 (large partition keys); " + new_container
        )
    policy = props.get("indexingPolicy") or {}
    if str(policy.get("indexingMode", "consistent")).lower() != "consistent" or policy.get("automatic") is False:
        problems.append(
            f"cosmos container {container!r} must use consistent, automatic indexing "
            f"(got indexingMode={policy.get('indexingMode')!r}, automatic={policy.get('automatic')!r}): run "
            f"`{APPLY_POLICY}` (replaces the indexing policy in place, online) or apply "
            "docs/azure/indexing-policy.json"
        )
    else:
        missing = [p for p in INDEXED_PATHS if not _indexed(p, policy)]
        if missing:
            problems.append(
                f"cosmos container {container!r} does not index {', '.join(missing)}, which the store queries: "
                f"run `{APPLY_POLICY}` (replaces the indexing policy in place, online) or apply "
                "docs/azure/indexing-policy.json"
            )
    return problems


def check_container(props: dict[str, Any], container: str) -> None:
    """Refuse a container the store cannot work on well, saying what to change; warn about one
    that works but costs more than it should."""
    problems = container_problems(props, container)
    if problems:
        raise ConfigurationError("; and ".join(problems))
    if indexes_payloads(props.get("indexingPolicy") or {}):
        log.warning(
            "cosmos container %r indexes every path (Cosmos' default; containers created by 0.1 have it): "
            "writes cost about twice the RU of the recommended policy. Run `%s` to replace it in place",
            container,
            APPLY_POLICY,
        )
