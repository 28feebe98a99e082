"""The worker bootsteps of celery_durable: the Celery-native owners of a worker's heartbeat and shutdown.

``Durable(app)`` adds :class:`DurableStep` to the worker blueprint (``app.steps["worker"]``) and
:class:`DurableShutdownStep` to the consumer blueprint (``app.steps["consumer"]``). When the
worker stops, the process it runs in gives back the activity leases it still holds and stops its
one heartbeat thread (engine/activities/lease_heartbeat.py), so recovery re-sends the interrupted steps at its
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
(glue/hook_receivers.py) reset the store after the fork and, once the child finished its tasks and
exits, do the same release. Before the worker starts, :class:`DurableStep` refuses a pool that
could not stop the effect handlers this worker would run (:func:`celery_durable.glue.pools.check_worker`)
and a store it cannot use (:func:`check_store`): a wrong or unreachable store URL, or a mistyped
``durable_*`` setting, exits the worker with one line before it reports ready, instead of a worker
that is "ready" and fails every drive.

Importing this module also adds the store URL to what Celery censors (:func:`install_censoring`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import celery.app.utils as celery_app_utils
from celery import bootsteps

from celery_durable.engine.drive import seals
from celery_durable.glue import pool_board
from celery_durable.glue.extension import DurableLike, durable_of
from celery_durable.glue.pools import check_worker, note_worker_limits, pool_name
from celery_durable.settings import censor_conf, redact_url

__all__ = [
    "DurableStep",
    "DurableShutdownStep",
    "DurableEventsStep",
    "DurableMetricsStep",
    "check_store",
    "install_censoring",
]

log = logging.getLogger("celery_durable.worker")

#: the start-up check reads this document, which never exists (one point read: ~1 RU on Cosmos)
PROBE_PK, PROBE_ID = "celery_durable.startup_check", "probe"


def check_store(durable: DurableLike, who: str = "this worker") -> None:
    """Read the settings, open the store and read one document; if any fails, exit (one line:
    ``… not starting <who>: <why>``).

    :class:`SystemExit` with the message: ``celery worker`` prints a traceback for any other
    exception, while Python prints the message of a ``SystemExit`` alone on stderr and exits with
    status 1. Runs in the worker's main process before any pool child exists, so the
    connection it opened is closed again (children must not inherit it).
    """
    try:
        durable.settings  # noqa: B018 - unknown keys, bad values
    except Exception as exc:
        raise SystemExit(_one_line("bad configuration", exc, who)) from None
    built = durable.engine_if_built is not None
    try:
        store = durable.engine.store
    except Exception as exc:
        raise SystemExit(_one_line("cannot use the store", exc, who)) from None
    probe_store(store, who)
    try:
        seals.warm(store)  # the message seal key, read once: a store outage later can still seal
    except Exception as exc:
        raise SystemExit(_one_line("cannot use the store", exc, who)) from None
    if not built:
        store.close()


def probe_store(store: Any, who: str) -> None:
    """Read one document (which never exists); exit with one line if the store cannot answer."""
    try:
        store.read(PROBE_PK, PROBE_ID)
    except Exception as exc:
        raise SystemExit(_one_line("cannot use the store", exc, who)) from None


def _one_line(what: str, exc: Exception, who: str) -> str:
    reason = redact_url(" ".join(f"{type(exc).__name__}: {exc}".split()))
    return f"celery_durable: {what}, not starting {who}: {reason}"


def install_censoring() -> None:
    """Make Celery censor ``durable_store_url`` (``celery report``, ``celery inspect conf/report``).

    Celery censors by setting *name* in ``celery.app.utils.filter_hidden_settings``, which
    ``Settings.table(censored=True)`` (and so ``humanize``) looks up at each call; the store URL's
    name matches none of its patterns though it may carry a Cosmos key. Wrapped once per process.
    """
    original = celery_app_utils.filter_hidden_settings
    if getattr(original, "celery_durable", False):
        return

    @functools.wraps(original)
    def filter_hidden_settings(conf: Any) -> Any:
        return censor_conf(original(conf))

    setattr(filter_hidden_settings, "celery_durable", True)  # noqa: B010 - a marker mypy allows
    celery_app_utils.filter_hidden_settings = filter_hidden_settings


install_censoring()


class DurableStep(bootsteps.StartStopStep):
    label = "celery_durable"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.durable = durable_of(worker.app)
        # --time-limit/--soft-time-limit are the worker's, not app.conf's: an eager activity
        # must not run under them, nor an outbox drain past them (pools.time_limit); noted before the pool forks
        note_worker_limits(getattr(worker, "time_limit", None), getattr(worker, "soft_time_limit", None))
        # what the pool processes running eager activities must learn from this one (revokes,
        # shutdown, task events): shared memory they inherit, so made before the pool forks
        pool_board.install()
        # before the worker connects: a gevent/eventlet worker must not take effects it cannot stop,
        # and no worker may report ready on a store it cannot use
        check_worker(worker, self.durable)
        try:
            check_store(self.durable)
        except SystemExit as exc:
            if getattr(worker, "logfile", None):  # --logfile / --detach: stderr may go unread
                log.critical("%s", exc.code)
            raise

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


class DurableEventsStep(bootsteps.StartStopStep):
    """A consumer step after Celery's ``Events``: tells the processes running eager activities
    whether this worker sends task events (glue/pool_board.py; ``enable_events`` and
    ``disable_events`` update it later)."""

    label = "celery_durable.events"
    requires = ("celery.worker.consumer.events:Events",)

    def start(self, consumer: Any) -> None:
        pool_board.note_task_events(getattr(consumer, "event_dispatcher", None))


class DurableMetricsStep(bootsteps.StartStopStep):
    """Serves Prometheus ``/metrics`` from the worker's main process when ``durable_metrics_port``
    is set (celery_durable/glue/metrics.py). Prepared here, before the pool forks (children inherit
    the listeners and prometheus_client's multiprocess directory); served once the pool runs, so
    no child inherits the listening socket."""

    label = "celery_durable.metrics"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.exporter: Any = None
        durable = durable_of(worker.app)
        try:
            port = durable.settings.metrics_port
            if port is None:
                return
            from celery_durable.glue.metrics import WorkerExporter

            self.exporter = WorkerExporter(durable, port, pool_name(getattr(worker, "pool_cls", None)))
        except Exception as exc:  # bad port, prometheus_client missing, store unusable
            message = _one_line("cannot export metrics", exc, "this worker")
            log.critical("%s", message)
            raise SystemExit(message) from None

    def start(self, worker: Any) -> None:
        if self.exporter is not None:
            self.exporter.start()

    def stop(self, worker: Any) -> None:
        if self.exporter is not None:
            self.exporter.stop()

    terminate = stop
