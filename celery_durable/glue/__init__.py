"""The Celery glue: with ``app.py``, ``cli/``, ``ui/`` and ``testing/``, the only code that imports
Celery or kombu.

It turns the engine's requests into Celery messages and Celery deliveries into engine calls: the
library's own tasks (``tasks``), ``@durable_activity`` (``durable_activity``), the effect outbox's
tasks (``outbox``), eager activities, the worker bootsteps that own heartbeat and shutdown,
Celery-style hooks (``hooks``, public as ``celery_durable.glue.hooks``) and Prometheus metrics
(public as ``celery_durable.glue.metrics``). Nothing below it (engine, stores) knows Celery exists.
"""
