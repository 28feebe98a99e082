"""Test helpers shipped with celery_durable, for users' own tests.

``env.WorkflowEnvironment`` (in-process, time skipping), the pytest plugin (``pytest_plugin``:
fixtures ``durable_app``, ``durable_env`` and ``durable_worker``), ``counting.CountingStore`` (round
trips per store call, for cost assertions), ``replay.replay`` (recorded histories replayed against
the code under test) and the Cosmos test server (``cosmos_server`` with its Node script): it
ships because users run it, ``python -m celery_durable.testing.cosmos_server``, to try the Cosmos
store and the example project without an account (docs: Azure Cosmos DB guide). The project's own
simulations are not here: they live in ``harness/`` in the repository and are not in the wheel.
"""
