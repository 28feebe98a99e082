"""The Azure Cosmos DB store (``store``: one container, partition key ``/pk``) and its parts: URL
and secrets (``config``), error translation (``errors``), ids and due-index rules (``index``),
reads (``read``), the due scan (``due``), listing (``listing``), search index (``search``),
session tokens (``session``), provisioning (``provision``) and in-place upgrades (``migrate``).

Importing ``store`` needs ``azure-cosmos`` (``pip install celery-durable[cosmos]``).
"""

from typing import Any

from celery_durable._moved import moved_attr

#: the names of the module this package replaced (issue 24), still found here
OLD_NAMES = frozenset({"CosmosStore", "from_url"})
#: a star import binds them as it did
__all__ = sorted(OLD_NAMES)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, "celery_durable.stores.cosmos.store", OLD_NAMES)
