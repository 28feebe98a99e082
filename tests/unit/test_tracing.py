"""OpenTelemetry spans around drives, activities and store calls (the ``otel`` extra).

A tracer provider can be set once per process: the fixture sets it when these tests run (not at
import), so only engines built afterwards trace their store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_durable import Durable, durable_activity
from celery_durable.stores import store_from_url
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.traced import TracedStore
from celery_durable.testing.env import WorkflowEnvironment

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def tracer_provider() -> None:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))


app = Celery("tracing", set_as_current=False)
durable = Durable(app, store="memory://")


@durable_activity(name="trace.double")
def double(x: int) -> int:
    return 2 * x


@durable.workflow(name="trace.flow")
def flow(x: int) -> int:
    return double(x) + double(x + 1)


def _run(store_url: str) -> list[object]:
    EXPORTER.clear()
    env = WorkflowEnvironment(durable, store=store_from_url(store_url))
    assert isinstance(env.engine.store, TracedStore)
    assert env.result(env.start(flow, 3)) == 14
    return list(EXPORTER.get_finished_spans())


def test_store_calls_and_commits_are_spans(tmp_path: Path) -> None:
    spans = _run(f"sqlite:///{tmp_path / 'trace.db'}")
    names = [s.name for s in spans]  # type: ignore[attr-defined]
    assert "celery_durable.commit" in names
    for op in ("create", "query_partition", "replace", "batch"):
        assert f"celery_durable.store.{op}" in names, names
    batch = next(s for s in spans if s.name == "celery_durable.store.batch")  # type: ignore[attr-defined]
    assert batch.attributes["durable.backend"] == "SqliteStore" and batch.attributes["durable.ops"] >= 2


@pytest.mark.cosmos
def test_cosmos_store_spans_carry_the_request_charge(cosmos_url: str) -> None:
    spans = _run(cosmos_url)
    charged = [s for s in spans if s.name.startswith("celery_durable.store.")]  # type: ignore[attr-defined]
    assert charged and all(s.attributes["durable.backend"] == "CosmosStore" for s in charged)  # type: ignore[attr-defined]
    assert all(s.attributes.get("durable.request_charge", 0) > 0 for s in charged)  # type: ignore[attr-defined]


def test_read_many_is_one_span_around_one_inner_call() -> None:
    inner = MemoryStore()
    inner.create({"pk": "p", "id": "a"})
    EXPORTER.clear()
    got = TracedStore(inner).read_many("p", ["a", "b", "a"])
    assert [d and d["id"] for d in got] == ["a", None, "a"]
    spans = [s for s in EXPORTER.get_finished_spans() if s.name.startswith("celery_durable.store.")]
    assert [s.name for s in spans] == ["celery_durable.store.read_many"]
    assert spans[0].attributes["durable.ids"] == 3 and spans[0].attributes["durable.pk"] == "p"  # type: ignore[index]
    assert inner.calls.get("read_many") == 1 and "read" not in inner.calls


def test_without_a_tracer_provider_no_span_is_opened() -> None:
    """A fresh process (a provider, once set, stays): with opentelemetry installed but no provider,
    span() hands out nothing instead of OpenTelemetry's non-recording proxy span (~20 µs each)."""
    import subprocess
    import sys

    code = (
        "from unittest import mock\n"
        "from opentelemetry import trace\n"
        "from celery_durable.observability import span\n"
        "with mock.patch.object(trace, 'get_tracer', side_effect=AssertionError('a tracer was asked for')):\n"
        "    with span('drive', execution_id='e') as current:\n"
        "        assert current is None, current\n"
        "trace.set_tracer_provider(__import__('opentelemetry.sdk.trace', fromlist=['x']).TracerProvider())\n"
        "with span('drive', execution_id='e') as current:\n"
        "    assert current is not None and current.is_recording()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
