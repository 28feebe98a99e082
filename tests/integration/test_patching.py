"""Versioning on real workers (issue 13, item 2): executions started on version 1 of
``tests.apps.patching`` wait for a signal; the workers stop; workers with the next version take
over. With ``wf.patched`` every execution completes (old ones on the old branch, new ones on the
new); changed without it, the old ones fail with a ``NonDeterminismError`` naming the step and
both calls. In-process: tests/engine/test_patching.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_durable import WorkflowFailedError
from tests.apps import patching
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

APP = "tests.apps.patching"


@pytest.fixture
def client(cluster: Any) -> Iterator[Any]:
    """The test process as a client of ``tests.apps.patching`` on the cluster's broker and store."""
    app = patching.app
    app.conf.update(broker_url=cluster.broker, task_default_queue=cluster.queue)
    app._pool = None
    app.amqp._producer_pool = None
    patching.durable.configure(store=cluster.store_url)
    yield cluster
    patching.durable.configure(store=None)


def _waiting(client: Any, version: int, n: int) -> list[Any]:
    """Start ``n`` executions on workers running ``version`` and wait until each waits for ``go``."""
    tag = uuid.uuid4().hex[:6]
    handles = [patching.flow.start(f"v{version}-{i}", _workflow_id=f"v{version}-{i}-{tag}") for i in range(n)]
    for h in handles:
        wait_until(
            lambda h=h: any(s.kind == "signal" for s in patching.durable.describe(h.id).steps),
            60,
            what=f"{h.id} to wait",
        )
    return handles


def test_patched_code_completes_executions_started_on_the_old_code(client: Any) -> None:
    v1 = client.start_worker(app=APP, env={"TEST_PATCH_VERSION": "1"})
    old = _waiting(client, 1, 3)
    v1.stop()  # mid-flight: every execution waits for its signal
    client.start_worker(app=APP, env={"TEST_PATCH_VERSION": "2"})
    new = _waiting(client, 2, 2)
    for h in old + new:
        assert h.signal("go", "shipped")
    for h in old:
        order = h.id.rsplit("-", 1)[0]
        assert h.result(timeout=60) == f"reserved {order}, shipped"  # the old branch
        assert [s.kind for s in patching.durable.describe(h.id).steps] == ["activity", "signal"]
    for h in new:
        order = h.id.rsplit("-", 1)[0]
        assert h.result(timeout=60) == f"reserved {order}, audited {order}, shipped"
        assert [s.kind for s in patching.durable.describe(h.id).steps] == ["activity", "patch", "activity", "signal"]


def test_code_changed_without_patched_fails_old_executions_naming_the_step(client: Any) -> None:
    v1 = client.start_worker(app=APP, env={"TEST_PATCH_VERSION": "1"})
    (old,) = _waiting(client, 1, 1)
    v1.stop()
    client.start_worker(app=APP, env={"TEST_PATCH_VERSION": "3"})
    assert old.signal("go", "shipped")
    with pytest.raises(WorkflowFailedError) as failed:
        old.result(timeout=60)
    assert failed.value.type_name == "NonDeterminismError"
    assert (
        "step 2: the history has signal 'go' but the code now calls activity 'patching.audit'" in failed.value.message
    )
    (fresh,) = _waiting(client, 3, 1)  # new executions run the new code
    assert fresh.signal("go", "shipped")
    assert fresh.result(timeout=60).endswith("audited v3-0, shipped")
