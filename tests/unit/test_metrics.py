"""celery_durable.glue.metrics in one process: engine events and store calls move the right metrics."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from celery_durable.errors import ConfigurationError
from celery_durable.glue.metrics import Metrics, check_port, serve
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment
from tests.apps import basic


def test_events_and_store_calls_are_exported() -> None:
    registry = CollectorRegistry()
    m = Metrics(registry)
    env = WorkflowEnvironment(basic.durable)
    env.engine.subscribe(m.on_event)
    m.instrument_store(env.engine.store)
    m.instrument_store(env.engine.store)  # idempotent: each call timed once

    assert env.result(env.start(basic.sum_chain, 3)) == 3
    assert env.result(env.start(basic.sleeper, "unit", 30.0)) == 0  # the fake clock jumps to the timer

    def get(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert get("celery_durable_executions_total", workflow="sum_chain", status="started") == 1
    assert get("celery_durable_executions_total", workflow="sum_chain", status="completed") == 1
    assert get("celery_durable_activity_attempts_total", activity="tests.apps.basic.add", outcome="completed") == 3
    assert get("celery_durable_timer_lateness_seconds_count") == 1
    assert get("celery_durable_timer_lateness_seconds_bucket", le="0.01") == 1
    assert get("celery_durable_events_total", event="workflow_completed") == 2
    reads = get("celery_durable_store_call_seconds_count", operation="read", backend="memory")
    assert reads > 0
    partitions = get("celery_durable_store_call_seconds_count", operation="query_partition", backend="memory")
    assert partitions > 0
    # the memory store has no request charge: no series for it
    assert get("celery_durable_store_request_charge_total", operation="read", backend="memory") == 0


def test_outbox_events_sample_backlog_and_claim_latency() -> None:
    registry = CollectorRegistry()
    m = Metrics(registry)
    m.on_event("effect_claimed", effect_id="a", key="k", attempt=1, effect_type="mail", backlog=3, waited=0.2)
    assert registry.get_sample_value("celery_durable_outbox_lane_backlog", {"effect_type": "mail"}) == 3
    assert registry.get_sample_value("celery_durable_outbox_claim_latency_seconds_sum", {"effect_type": "mail"}) == 0.2
    m.on_event("effect_settled", effect_id="a", key="k", outcome="succeeded", attempt=1, effect_type="mail", backlog=2)
    assert registry.get_sample_value("celery_durable_outbox_lane_backlog", {"effect_type": "mail"}) == 2
    labels = {"effect_type": "mail", "outcome": "succeeded"}
    assert registry.get_sample_value("celery_durable_effects_total", labels) == 1
    m.on_event("recovery_redrive", execution_id="x")
    assert registry.get_sample_value("celery_durable_recoveries_total", {"action": "redrive"}) == 1


def test_request_charge_is_counted_for_a_store_that_reports_one() -> None:
    class Charged(MemoryStore):
        last_request_charge = 2.5

    registry = CollectorRegistry()
    m = Metrics(registry)
    store = Charged()
    m.instrument_store(store)
    store.read("p", "d")
    store.read("p", "d")
    labels = {"operation": "read", "backend": "charged"}
    assert registry.get_sample_value("celery_durable_store_request_charge_total", labels) == 5.0


@pytest.mark.parametrize("bad", [0, 70000, -1, "http", True, 1.5])
def test_bad_ports_are_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="durable_metrics_port must be a TCP port"):
        check_port(bad)


def test_port_as_text_is_read() -> None:
    assert check_port("9100") == 9100


def test_serve_from_any_process() -> None:
    server = serve(0, addr="127.0.0.1", app=basic.app)
    try:
        with urllib.request.urlopen(server.url, timeout=5) as resp:
            text = resp.read().decode()
        assert "celery_durable_store_call_seconds" in text
        assert "celery_durable_executions_total" in text
    finally:
        server.stop()


def test_the_grafana_dashboard_charts_exported_metrics() -> None:
    import json
    import re
    from pathlib import Path

    registry = CollectorRegistry()
    m = Metrics(registry)
    for event, kw in [
        ("workflow_started", {"workflow": "w"}),
        ("activity_completed", {"activity": "a"}),
        ("timer_fired", {"lateness": 0.1}),
        ("recovery_resend", {}),
        ("effect_claimed", {"effect_type": "t", "backlog": 1, "waited": 0.0}),
        ("effect_settled", {"effect_type": "t", "outcome": "succeeded", "backlog": 0}),
    ]:
        m.on_event(event, **kw)
    m.store_latency.labels("read", "cosmos").observe(0.01)
    m.request_charge.labels("read", "cosmos").inc(1.0)
    exported = {s.name for family in registry.collect() for s in family.samples}
    dashboard = (Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text()
    charted = set(re.findall(r"celery_durable_[a-z_]+", json.dumps(json.loads(dashboard))))
    assert charted and charted <= exported, charted - exported
    assert len(charted) >= 10
