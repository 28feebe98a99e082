"""The worker bootstep of celery_durable: the Celery-native owner of a worker's heartbeat and shutdown.

``Durable(app)`` adds :class:`DurableStep` to the worker blueprint (``app.steps["worker"]``).
When the worker stops (warm or cold shutdown) the step gives back the activity leases held by
the process it runs in and stops that process's one heartbeat thread (engine/heartbeat.py), so
recovery re-sends the interrupted steps at its next scan instead of after the lease TTL. Pool
child processes (prefork) have no bootsteps: there the ``worker_process_init`` and
``worker_process_shutdown`` signals (signals/receivers.py) reset the store after the fork and do
the same release. Before the worker starts, the step refuses a pool that could not stop the
effect handlers this worker would run (:func:`celery_durable.pools.check_worker`).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from .extension import durable_of
from .pools import check_worker

__all__ = ["DurableStep"]

log = logging.getLogger("celery_durable.worker")


class DurableStep(bootsteps.StartStopStep):
    label = "celery_durable"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.durable = durable_of(worker.app)
        # before the worker connects: a gevent/eventlet worker must not take effects it cannot stop
        check_worker(worker, self.durable)

    def start(self, worker: Any) -> None:
        log.debug("celery_durable: worker started (store %s)", self.durable.settings.store_url_redacted)

    def stop(self, worker: Any) -> None:  # warm shutdown
        self.durable.shutdown()

    def terminate(self, worker: Any) -> None:  # cold shutdown
        self.durable.shutdown()
