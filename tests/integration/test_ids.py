"""Workflow ids and child ids on a real ``celery worker`` (issue 12, "edges"): the checks of
``start()`` in the client, and an explicit child id started twice (joined or refused, never a hang).
The same cases in ``WorkflowEnvironment``: tests/engine/test_regressions_ids.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_durable.errors import InvalidWorkflowId
from tests.apps import ids

pytestmark = pytest.mark.worker

APP = "tests.apps.ids"


@pytest.fixture
def client(cluster: Any) -> Iterator[Any]:
    """The test process as a client of ``tests.apps.ids``, on the cluster's broker and store."""
    app = ids.app
    app.conf.update(broker_url=cluster.broker, task_default_queue=cluster.queue)
    app._pool = None
    app.amqp._producer_pool = None
    ids.durable.configure(store=cluster.store_url)
    yield cluster
    ids.durable.configure(store=None)


def test_ids_on_a_worker(client: Any) -> None:
    client.start_worker(app=APP)
    tag = uuid.uuid4().hex[:8]
    with pytest.raises(InvalidWorkflowId):  # in the client: nothing stored, nothing sent
        ids.child.start("squat", _workflow_id=f"victim-{tag}-c1")
    assert ids.parent.start(_workflow_id=f"victim-{tag}").result(timeout=60) == "default"
    # the same explicit id twice: joined with the same input, refused with another
    assert ids.twice.start(f"kid-{tag}", "same", "same").result(timeout=60) == "samesame"
    assert ids.twice.start(f"kid2-{tag}", "one", "two").result(timeout=60) == "refused: ChildIdTaken"
    # two steps in one drive on one running child: both get its outcome
    h = ids.both.start(f"shared-{tag}")
    deadline = time.monotonic() + 60
    while ids.durable.store.read(f"shared-{tag}", "exec") is None:  # created after the parent's drive
        assert time.monotonic() < deadline, f"the child was never started; parent {h.status()}"
        time.sleep(0.02)
    assert ids.durable.signal(f"shared-{tag}", "go", "!")
    assert h.result(timeout=60) == "t!|t!"
