"""Prometheus metrics of the engine and the outbox (``pip install celery-durable[prometheus]``).

What is exported (names as Prometheus shows them; ``docs/grafana-dashboard.json`` charts them):

==================================================  ==============================================
``celery_durable_events_total{event}``              every engine event (what ``durable.counters``
                                                    counts in one process)
``celery_durable_executions_total{workflow,status}``  started, completed, failed, cancelled, timed_out
``celery_durable_activity_attempts_total``          each attempt that ran an activity, by its
``{activity,outcome}``                              outcome: completed, retried (Celery retries
                                                    it), failed (the workflow sees the error)
``celery_durable_timer_lateness_seconds``           histogram: fire time − due time of timers
``celery_durable_recoveries_total{action}``         redrive, resend (engine recovery), lease_lost;
                                                    effect_resend, effect_requeue, effect_fail
``celery_durable_effects_total{effect_type,outcome}``  settled effect attempts
``celery_durable_outbox_lane_backlog{effect_type}``  gauge: live rows of the lane last claimed or
                                                    settled for this type (sampled from its head)
``celery_durable_outbox_claim_latency_seconds``     histogram: claim time − the time the row
``{effect_type}``                                   became claimable
``celery_durable_store_call_seconds``               histogram: each store call the engine makes
``{operation,backend}``
``celery_durable_store_request_charge_total``       Cosmos request units, per operation
``{operation,backend}``
==================================================  ==============================================

Where they are served:

* **a worker** with ``durable_metrics_port`` set: a worker bootstep
  (:class:`celery_durable.glue.bootsteps.DurableMetricsStep`) serves ``/metrics`` from the worker's
  main process. A prefork pool runs the tasks (so the events) in child processes: the worker
  then uses prometheus_client's *multiprocess mode* — each process writes its values to memory
  mapped files in ``$PROMETHEUS_MULTIPROC_DIR`` (a fresh temporary directory unless you set one;
  children inherit it through ``fork``) and the main process serves their sum. Counters of a
  child that exited stay in its file, so totals never go backwards when prefork replaces a child.
  Threads, solo, gevent and eventlet pools run everything in one process: plain registry.
* **any process** (a web app that starts workflows, a script): :func:`serve` ``(port)``.

Store calls are timed by wrapping the methods of the engine's store *object* (every part of the
engine holds that one object, and the engine may exist before metrics are enabled: the worker's
start-up check builds it), so nothing costs anything until metrics are on.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess, values
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "celery_durable.metrics needs prometheus_client: pip install 'celery-durable[prometheus]'"
    ) from exc

from celery_durable.engine.core import Engine
from celery_durable.errors import ConfigurationError
from celery_durable.glue.extension import DurableLike, durable_of
from celery_durable.stores.base import Store

__all__ = ["Metrics", "MetricsServer", "metrics", "instrument", "serve", "check_port", "WorkerExporter"]

log = logging.getLogger("celery_durable.metrics")

#: the store methods timed (the calls the engine makes)
STORE_OPERATIONS = (
    "read",
    "read_many",
    "create",
    "replace",
    "upsert",
    "delete",
    "query_partition",
    "batch",
    "scan_due",
    "scan_partitions",
    "list_execs",
)
_STATUS_EVENTS = {
    "workflow_started": "started",
    "workflow_completed": "completed",
    "workflow_failed": "failed",
    "workflow_cancelled": "cancelled",
    "workflow_timed_out": "timed_out",
}
_RECOVERY_EVENTS = {
    "recovery_redrive": "redrive",
    "recovery_resend": "resend",
    "lease_lost": "lease_lost",
    "effect_resent": "effect_resend",
    "effect_requeued": "effect_requeue",
    "effect_failed": "effect_fail",
}
_LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class Metrics:
    """The metric objects, and the listeners that move them."""

    def __init__(self, registry: CollectorRegistry | None = prometheus_client.REGISTRY) -> None:
        def make(kind: Any, name: str, doc: str, labels: tuple[str, ...] = (), **kw: Any) -> Any:
            return kind(f"celery_durable_{name}", doc, labels, registry=registry, **kw)

        self.events = make(Counter, "events", "Engine events, by name", ("event",))
        self.executions = make(Counter, "executions", "Executions by status reached", ("workflow", "status"))
        self.activity_attempts = make(
            Counter, "activity_attempts", "Activity attempts run, by outcome", ("activity", "outcome")
        )
        self.timer_lateness = make(
            Histogram, "timer_lateness_seconds", "Timer fire time minus due time", buckets=_LATENESS_BUCKETS
        )
        self.recoveries = make(Counter, "recoveries", "Recovery actions", ("action",))
        self.effects = make(Counter, "effects", "Settled effect attempts, by outcome", ("effect_type", "outcome"))
        self.lane_backlog = make(
            Gauge,
            "outbox_lane_backlog",
            "Live rows of the lane last claimed or settled for this effect type",
            ("effect_type",),
            multiprocess_mode="mostrecent",  # one lane's depth: the latest sample of any process
        )
        self.claim_latency = make(
            Histogram,
            "outbox_claim_latency_seconds",
            "Claim time minus the time the effect row became claimable",
            ("effect_type",),
            buckets=_LATENESS_BUCKETS,
        )
        self.store_latency = make(
            Histogram, "store_call_seconds", "Store call latency", ("operation", "backend"), buckets=_STORE_BUCKETS
        )
        self.request_charge = make(
            Counter, "store_request_charge", "Cosmos request units charged", ("operation", "backend")
        )

    # --- engine events ------------------------------------------------------------------

    def on_event(self, event: str, **kw: Any) -> None:
        """Engine listener (:meth:`Engine.subscribe`)."""
        self.events.labels(event).inc()
        status = _STATUS_EVENTS.get(event)
        if status is not None:
            self.executions.labels(str(kw.get("workflow") or "?"), status).inc()
        elif event in ("activity_completed", "activity_failed"):
            self.activity_attempts.labels(str(kw.get("activity") or "?"), event.removeprefix("activity_")).inc()
        elif event == "timer_fired":
            self.timer_lateness.observe(max(0.0, float(kw.get("lateness") or 0.0)))
        elif event in _RECOVERY_EVENTS:
            self.recoveries.labels(_RECOVERY_EVENTS[event]).inc()
        elif event in ("effect_claimed", "effect_settled"):
            kind = str(kw.get("effect_type") or "?")
            if kw.get("backlog") is not None:
                self.lane_backlog.labels(kind).set(int(kw["backlog"]))
            if event == "effect_settled":
                self.effects.labels(kind, str(kw.get("outcome") or "?")).inc()
            elif kw.get("waited") is not None:
                self.claim_latency.labels(kind).observe(max(0.0, float(kw["waited"])))

    def on_task_postrun(self, task: Any = None, state: str | None = None, **_: Any) -> None:
        """Celery ``task_postrun``: an activity attempt Celery will retry emits no engine event."""
        attempt = getattr(getattr(task, "request", None), "durable_attempt", None)
        if attempt is not None and state == "RETRY":
            self.activity_attempts.labels(str(attempt.name), "retried").inc()

    # --- store calls --------------------------------------------------------------------

    def instrument_store(self, store: Store) -> None:
        """Time every call of ``store`` (and count its Cosmos request charge); idempotent."""
        if store.__dict__.get("_durable_metrics") is not None:
            return
        inner = getattr(store, "inner", store)  # TracedStore: the backend underneath
        backend = type(inner).__name__.removesuffix("Store").lower() or "store"
        charged = hasattr(type(inner), "last_request_charge")
        for op in STORE_OPERATIONS:
            setattr(store, op, self._timed(getattr(store, op), op, backend, inner if charged else None))
        store.__dict__["_durable_metrics"] = self

    def _timed(self, call: Callable[..., Any], op: str, backend: str, charged: Any) -> Callable[..., Any]:
        latency = self.store_latency.labels(op, backend)
        charge = self.request_charge.labels(op, backend) if charged is not None else None

        @functools.wraps(call)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                latency.observe(time.perf_counter() - started)
                if charge is not None:
                    # the client's latest response: approximate when threads share the client
                    units = charged.last_request_charge
                    if units:
                        charge.inc(float(units))

        return timed


_lock = threading.Lock()
_metrics: Metrics | None = None
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def metrics() -> Metrics:
    """This process's metrics, in prometheus_client's default registry (created once)."""
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = Metrics()
            from celery import signals

            signals.task_postrun.connect(_on_task_postrun, weak=False, dispatch_uid="celery_durable.metrics")
        return _metrics


def _on_task_postrun(**kwargs: Any) -> None:
    if _metrics is not None:
        _metrics.on_task_postrun(**kwargs)


def instrument(durable: DurableLike | Any) -> Engine:
    """Export the events and store calls of ``durable``'s engine (a ``Durable`` or a Celery app
    with one); builds the engine if needed. Idempotent."""
    if not hasattr(durable, "engine"):
        durable = durable_of(durable)
    return instrument_engine(durable.engine)


def instrument_engine(engine: Engine) -> Engine:
    """Export the events and store calls of ``engine`` (the web UI's, say). Idempotent."""
    m = metrics()
    with _lock:
        if engine not in _engines:
            engine.subscribe(m.on_event)
            m.instrument_store(engine.store)
            _engines.add(engine)
    return engine


def check_port(value: Any) -> int:
    """``durable_metrics_port`` as a TCP port number, or :class:`ConfigurationError`."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ConfigurationError(f"durable_metrics_port must be a TCP port (1-65535), got {value!r}")
    return value


class MetricsServer:
    """A running ``/metrics`` endpoint (prometheus_client's HTTP server on a daemon thread)."""

    def __init__(self, port: int, addr: str, registry: CollectorRegistry) -> None:
        self.server, self.thread = prometheus_client.start_http_server(port, addr=addr, registry=registry)
        self.port: int = self.server.server_port
        self.addr = addr

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "") else self.addr
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _registry() -> CollectorRegistry:
    """What to serve: the sum over all processes in multiprocess mode, else the default registry."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return prometheus_client.REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path)  # type: ignore[no-untyped-call]
    return registry


def exposition() -> tuple[bytes, str]:
    """What ``/metrics`` answers (body, content type): every process's metrics sharing
    ``PROMETHEUS_MULTIPROC_DIR`` when it is set, else this process's."""
    return prometheus_client.generate_latest(_registry()), prometheus_client.CONTENT_TYPE_LATEST


def serve(port: int, addr: str = "0.0.0.0", app: Any = None) -> MetricsServer:
    """Serve this process's metrics on ``http://addr:port/metrics`` (``port=0``: any free port).

    ``app`` (a Celery app or its ``Durable``) is instrumented first; without it, the current
    Celery app's, if it has one. Returns the server (``.url``, ``.stop()``).
    """
    if port != 0:
        port = check_port(port)
    if app is None:
        from celery import current_app

        app = current_app if _durable_or_none(current_app) is not None else None
    if app is not None:
        instrument(app)
    else:
        metrics()
    return MetricsServer(port, addr, _registry())


def _durable_or_none(app: Any) -> DurableLike | None:
    try:
        return durable_of(app)
    except Exception:
        return None


def _use_multiprocess() -> None:
    """Make this process's metrics multiprocess values (prometheus_client reads the class when a
    metric is created, and chooses it at import from ``$PROMETHEUS_MULTIPROC_DIR``)."""
    if values.ValueClass is not values.MutexValue:  # multiprocess already
        return
    if _metrics is not None:
        raise ConfigurationError(
            "celery_durable metrics were created before this prefork worker chose prometheus_client's "
            "multiprocess mode: set PROMETHEUS_MULTIPROC_DIR before the worker starts"
        )
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]


class WorkerExporter:
    """The worker's ``/metrics``: prepared in the main process before the pool forks (so the
    children inherit the listeners and the multiprocess directory), served once the pool runs."""

    def __init__(self, durable: DurableLike, port: int, pool: str) -> None:
        self.port = check_port(port)
        self.durable = durable
        self.owned_dir: str | None = None
        if pool == "prefork" and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # a fresh directory per worker start: counters begin at 0, as after any restart
            self.owned_dir = tempfile.mkdtemp(prefix="celery-durable-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.owned_dir  # inherited by the children
            atexit.register(self._remove_dir, os.getpid())
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            _use_multiprocess()
        instrument(durable)
        self.server: MetricsServer | None = None

    def start(self) -> None:
        try:
            self.server = MetricsServer(self.port, "0.0.0.0", _registry())
        except OSError as exc:
            raise SystemExit(f"celery_durable: cannot serve metrics on port {self.port}: {exc}") from None
        log.info("celery_durable: metrics on %s", self.server.url)

    def stop(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop()
            self.server = None

    def _remove_dir(self, pid: int) -> None:
        # at the main process's exit, once the pool's children are gone (never in a child)
        if self.owned_dir is not None and os.getpid() == pid:
            shutil.rmtree(self.owned_dir, ignore_errors=True)
