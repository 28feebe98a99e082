"""Prometheus metrics, public path (``pip install celery-durable[prometheus]``); defined in
:mod:`celery_durable.glue.metrics`. ``celery_durable.metrics.serve(port)`` serves a process's own.
"""

from celery_durable.glue.metrics import (
    Metrics,
    MetricsServer,
    WorkerExporter,
    check_port,
    instrument,
    metrics,
    serve,
)

__all__ = [
    "Metrics",
    "MetricsServer",
    "metrics",
    "instrument",
    "serve",
    "check_port",
    "WorkerExporter",
]
