"""Test helpers shipped with celery_durable (a Cosmos DB test server harness, ...)."""
