"""Declaring and starting workflows: ``async def`` refused, ids through ``options()`` or ``_workflow_id``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from celery import Celery

from celery_durable import Durable
from celery_durable.errors import InvalidWorkflowId
from celery_durable.testing.env import WorkflowEnvironment


def _durable(name: str) -> Durable:
    return Durable(Celery(name, broker="memory://"), store="memory://")


def test_async_workflow_is_refused_at_decoration() -> None:
    durable = _durable("edges_async")

    async def fetch(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="workflows must be plain functions; async activities are supported"):
        durable.workflow(fetch)
    with pytest.raises(TypeError, match="fetch"):
        durable.workflow(name="edges.fetch")(fetch)
    assert durable.registry.workflow("edges.fetch") is None


def test_generator_workflows_are_refused_too() -> None:
    durable = _durable("edges_gen")

    def numbers(n: int) -> Iterator[int]:
        yield n

    async def stream(n: int) -> AsyncIterator[int]:
        yield n

    for fn in (numbers, stream):
        with pytest.raises(TypeError, match="workflows must be plain functions"):
            durable.workflow(fn)


def test_options_and_workflow_id_name_the_execution() -> None:
    durable = _durable("edges_ids")

    @durable.workflow(name="edges.kid")
    def kid(x: int) -> int:
        return x * 2

    @durable.workflow(name="edges.parent")
    def parent(x: int) -> int:
        a = kid.options(workflow_id=f"kid-a-{x}").start_child(x).result()
        b = kid.start_child(x + 1, _workflow_id=f"kid-b-{x}").result()
        return a + b

    env = WorkflowEnvironment(durable)
    h = env.start(parent, 1)
    assert env.result(h) == 2 + 4
    assert env.handle("kid-a-1").result(timeout=0) == 2
    assert env.handle("kid-b-1").result(timeout=0) == 4

    # the client side, on the app's own engine (a memory store; the drive message goes nowhere)
    assert parent.options(workflow_id="order-7").start(7).id == "order-7"
    assert parent.start(8, _workflow_id="order-8").id == "order-8"
    assert durable.handle("order-7").status() == "running"
    with pytest.raises(InvalidWorkflowId):
        parent.options(workflow_id=" ")
