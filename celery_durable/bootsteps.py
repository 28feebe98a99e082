"""The worker bootsteps of celery_durable: the Celery-native owners of a worker's heartbeat and shutdown.

``Durable(app)`` adds :class:`DurableStep` to the worker blueprint (``app.steps["worker"]``) and
:class:`DurableShutdownStep` to the consumer blueprint (``app.steps["consumer"]``). When the
worker stops, the process it runs in gives back the activity leases it still holds and stops its
one heartbeat thread (engine/heartbeat.py), so recovery re-sends the interrupted steps at its
next scan instead of after the lease TTL.

*When* matters. A warm shutdown (SIGTERM) waits for the running tasks inside the ``Pool`` step's
``stop`` (``-P threads``: the executor's shutdown; prefork: closing and joining the children);
until they finished, their leases must still be renewed. The worker stops its steps in reverse
boot order, and a step without a dependency on ``Pool`` (this one) has no fixed place in that
order: it follows the hash order of the blueprint's set of steps. So the warm ``stop`` does not
touch the heartbeat; :meth:`DurableShutdownStep.shutdown` does, from ``WorkController.on_stopped``
(``Consumer.shutdown``), which runs once every worker step stopped, i.e. after the pool drained.
A cold shutdown (:meth:`DurableStep.terminate`) stops at once. Pool child processes (prefork)
have no bootsteps: there the ``worker_process_init`` and ``worker_process_shutdown`` signals
(signals/receivers.py) reset the store after the fork and, once the child finished its tasks and
exits, do the same release. Before the worker starts, :class:`DurableStep` refuses a pool that
could not stop the effect handlers this worker would run (:func:`celery_durable.pools.check_worker`).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from .extension import durable_of
from .pools import check_worker

__all__ = ["DurableStep", "DurableShutdownStep"]

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

    def stop(self, worker: Any) -> None:
        """Warm shutdown: nothing yet. This may run before the ``Pool`` step waits for the running
        tasks (``-P threads``: in this process), whose leases the heartbeat must renew till they
        finished; :meth:`DurableShutdownStep.shutdown` stops it after the pool drained."""

    def terminate(self, worker: Any) -> None:
        """Cold shutdown: stop the heartbeat and give the leases back at once."""
        self.durable.shutdown()


class DurableShutdownStep(bootsteps.StartStopStep):
    """A consumer step for its ``shutdown``: Celery sends it (``Consumer.shutdown``, from
    ``WorkController.on_stopped``) once, after every worker step stopped, warm or cold. Its
    ``stop`` (also run when the consumer reconnects to the broker) does nothing."""

    label = "celery_durable.shutdown"

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.durable = durable_of(consumer.app)

    def shutdown(self, consumer: Any) -> None:
        self.durable.shutdown()
