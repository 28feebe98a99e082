"""An order-fulfilment shop on celery_durable: ``python -m example_project``.

Modules: :mod:`.app` (Celery app + ``Durable``, configured from the environment),
:mod:`.models` (pydantic payloads), :mod:`.activities` (Celery tasks that are durable steps),
:mod:`.workflows` (the ``fulfil_order`` saga) and ``__main__`` (starts workers, runs orders).

This module imports nothing on purpose: ``__main__`` must set the environment before
:mod:`.app` reads it.
"""
