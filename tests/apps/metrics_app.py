"""``celery -A tests.apps.metrics_app worker``: the basic test app (its workflows and activities),
serving Prometheus metrics on ``$TEST_METRICS_PORT`` (``durable_metrics_port``), plus one effect."""

from __future__ import annotations

import os
from typing import Any

from tests.apps.basic import app, durable

__all__ = ["app", "durable", "ping"]

if os.environ.get("TEST_METRICS_PORT"):
    app.conf.durable_metrics_port = int(os.environ["TEST_METRICS_PORT"])


@durable.effect("metrics.ping")
def ping(payload: Any) -> None:
    """An effect for the outbox metrics: does nothing."""
