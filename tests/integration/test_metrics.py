"""Prometheus metrics served by a real ``celery worker`` (``durable_metrics_port``), scraped over HTTP."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from celery_durable.glue.metrics import serve
from tests.apps import basic, metrics_app
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_worker_serves_metrics_that_move(cluster, pool: str) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    # prefork: the tasks (so the events) run in two child processes; the main process serves their sum
    env = {"TEST_METRICS_PORT": str(port), "TEST_FAST_TIMER_MAX": "60"}
    worker = cluster.start_worker(app="tests.apps.metrics_app", pool=pool, concurrency=2, env=env)
    before = scrape(port)
    assert value(before, "celery_durable_executions_total") == 0
    # executions start in the process that calls start(): this one, serving its own metrics
    client = serve(0, app=basic.app)
    client_before = scrape(client.port)

    sums = [basic.sum_chain.start(4) for _ in range(2)]
    flaky = basic.retry_then_ok.start(f"m-{pool}", 2)  # fails twice, Celery retries, then ok
    down = basic.compensate.start(f"m-{pool}")  # 3 attempts fail: the workflow catches it
    sleeper = basic.sleeper.start(f"m-{pool}", 0.5)
    assert [h.result(timeout=60) for h in sums] == [6, 6]
    assert flaky.result(timeout=60) == "ok after 3"
    assert down.result(timeout=60)["caught"] == "ConnectionError"
    assert sleeper.result(timeout=60) >= 0
    admitted = metrics_app.durable.outbox.enqueue("metrics.ping", {"n": 1}, key=f"lane-{pool}")
    wait_until(lambda: metrics_app.durable.outbox.get(admitted.effect_id).status == "succeeded", what="the effect")

    def settled() -> Samples | None:
        # the last events (the drive after the last step, the settle) may land just after result()
        got = scrape(port)
        done = value(got, "celery_durable_executions_total", status="completed")
        return got if done >= 5 and value(got, "celery_durable_effects_total") >= 1 else None

    after = wait_until(settled, timeout=20, what="the counters to catch up")
    assert isinstance(after, dict)
    client_after = scrape(client.port)
    client.stop()
    started = "celery_durable_executions_total"
    assert value(client_after, started, workflow="sum_chain", status="started") == 2 + value(
        client_before, started, workflow="sum_chain", status="started"
    )
    assert value(client_after, started, status="started") == 5 + value(client_before, started, status="started")
    assert value(after, "celery_durable_executions_total", workflow="sum_chain", status="completed") == 2
    assert value(after, "celery_durable_executions_total", status="completed") == 5
    assert value(after, "celery_durable_executions_total", status="failed") == 0
    attempts = "celery_durable_activity_attempts_total"
    assert value(after, attempts, activity="tests.apps.basic.add", outcome="completed") == 9  # + the undo in compensate
    assert value(after, attempts, activity="tests.apps.basic.flaky", outcome="retried") == 2
    assert value(after, attempts, activity="tests.apps.basic.flaky", outcome="completed") == 1
    assert value(after, attempts, activity="tests.apps.basic.always_down", outcome="retried") == 2
    assert value(after, attempts, activity="tests.apps.basic.always_down", outcome="failed") == 1
    assert value(after, "celery_durable_timer_lateness_seconds_count") == 1
    assert value(after, "celery_durable_events_total", event="timer_fired") == 1
    assert value(after, "celery_durable_effects_total", effect_type="metrics.ping", outcome="succeeded") == 1
    assert value(after, "celery_durable_outbox_claim_latency_seconds_count", effect_type="metrics.ping") == 1
    # sampled at the settle: the lane is empty again
    assert value(after, "celery_durable_outbox_lane_backlog", effect_type="metrics.ping") == 0
    reads = value(after, "celery_durable_store_call_seconds_count", operation="read", backend="sqlite")
    batches = value(after, "celery_durable_store_call_seconds_count", operation="batch", backend="sqlite")
    assert reads + batches > 20
    assert value(after, "celery_durable_recoveries_total") == 0
    assert "celery_durable: metrics on http://" in worker.log()


def test_metrics_port_in_use_stops_the_worker_with_one_line(cluster) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(AssertionError, match="cannot serve metrics on port"):
            cluster.start_worker(app="tests.apps.metrics_app", env={"TEST_METRICS_PORT": str(port)}, ready_timeout=30)


def test_bad_metrics_port_stops_the_worker_before_ready(cluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AssertionError, match="durable_metrics_port must be a TCP port"):
        cluster.start_worker(app="tests.apps.metrics_app", env={"TEST_METRICS_PORT": "70000"}, ready_timeout=30)
