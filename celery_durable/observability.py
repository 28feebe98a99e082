"""Observability: counters, structured log context and optional OpenTelemetry spans.

* :class:`Counters` counts every engine event (``workflow_completed``, ``activity_failed``,
  ``timer_fired``, ``recovery_resend``, ``drive_conflict``, ``stale_read_retry`` /
  ``stale_read_drop`` (deliveries re-sent because a stale read may explain a refusal, and those
  given up: :mod:`celery_durable.glue.session_tokens`) …); ``durable.counters.snapshot()``
  returns a plain dict a Prometheus exporter can publish.
* :func:`span` opens an OpenTelemetry span when the ``otel`` extra is installed
  (``pip install celery-durable[otel]``) and is a no-op otherwise.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

__all__ = ["Counters", "span", "tracing_configured"]

_otel_trace: Any
try:  # optional dependency
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - depends on the environment
    _otel_trace = None


class Counters:
    """Thread-safe event counters; subscribe :meth:`on_event` to an engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def on_event(self, event: str, **_: Any) -> None:
        with self._lock:
            self._counts[event] += 1

    def incr(self, name: str, by: int = 1) -> None:
        with self._lock:
            self._counts[name] += by

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def tracing_configured() -> bool:
    """Whether opentelemetry is installed *and* the application set a tracer provider.

    Store calls are only wrapped in spans then: without a provider they would be no-ops that
    still cost a wrapper per call.
    """
    if _otel_trace is None:
        return False
    return not isinstance(_otel_trace.get_tracer_provider(), _otel_trace.ProxyTracerProvider)


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """An OpenTelemetry span named ``celery_durable.<name>`` (no-op without opentelemetry).

    Without a tracer provider set (:func:`tracing_configured`) no span is opened: OpenTelemetry's
    proxy would hand out a non-recording one anyway, at ~20 µs a span (a few per activity). The
    provider is looked up on every call, so one set later is used from then on.
    """
    if not tracing_configured():
        yield None
        return
    tracer = _otel_trace.get_tracer("celery_durable")
    with tracer.start_as_current_span(f"celery_durable.{name}") as current:
        for key, value in attributes.items():
            if value is not None:
                current.set_attribute(f"durable.{key}", value)
        yield current
