"""The Azure Cosmos DB store (``store``: one container, partition key ``/pk``) and its parts: URL
and secrets (``config``), error translation (``errors``), ids and due-index rules (``index``),
reads (``read``), the due scan (``due``), listing (``listing``), search index (``search``),
session tokens (``session``), provisioning (``provision``) and in-place upgrades (``migrate``).

Importing ``store`` needs ``azure-cosmos`` (``pip install celery-durable[cosmos]``).
"""
