"""Breaker (issue 26, hand-offs on real workers): what the hand-off of a freed limit slot to the
next waiting step, in the process that freed it, does on real ``celery worker`` processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apps import handoff_breaker as hb
from tests.integration.conftest import (  # noqa: F401 - the worker tests' fixtures
    _postgres_server,
    cluster,
    postgres_schema,
    postgres_url,
)
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

APP = "tests.apps.handoff_breaker"
FAST = {
    "TEST_LEASE_TTL": "3",
    "TEST_HEARTBEAT": "0.5",
    "TEST_RECOVERY_INTERVAL": "1",
    "TEST_DRIVE_TIMEOUT": "3",
    "TEST_QUEUE_TIMEOUT": "6",
}


@pytest.fixture
def fx(cluster: Any, tmp_path: Path) -> Iterator[Any]:  # noqa: F811
    cluster.workers.env.update(FAST)
    with cluster.client_of(hb, tmp_path / "marks") as durable:
        yield durable


def _lines(key: str) -> list[tuple[str, float, int, str]]:
    path = hb.MARKS / f"hspan-{key}"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        what, at, pid, tag = line.split()
        out.append((what, float(at), int(pid), tag))
    return out


def _at(key: str, what: str, tag: str) -> float:
    return next(at for w, at, _, t in _lines(key) if w == what and t == tag)


# ---------------------------------------------------------------------------------------------
# 1. an activity that fails for good hands its slot off before its own workflow learns of it
#
# Mechanism: ``_run_attempt`` (celery_durable/glue/durable_activity.py:289) records a failure
# for good with ``_record(..., defer=True)``: the outcome's commit frees the slot and grants it
# to the next waiter, which ``send_granted`` (engine/limits/grants.py:65) keeps as this
# delivery's hand-off; ``eagerly`` (glue/eager_activities.py:437-441) then runs ``run_kept``
# (the hand-off, and every hand-off that one's own end makes, for up to HANDOFF_SECONDS = 60 s)
# *before* returning to ``_run_attempt``, which only then raises the failure (Celery's FAILURE,
# task-failed, the ERROR line) and, in ``after_return`` (durable_activity.py:69-81), drives the
# failed step's own workflow. So a workflow whose limited step failed waits for a chain of
# other workflows' steps before it learns of it (and Celery reports the failure that late);
# on success the drive is inside the commit, and its own next step runs before any hand-off.
# Fixed: a failure for good's commit runs no hand-off (``eagerly(..., handoffs=False)``): the step
# its slot is granted to is sent at once, and the failure reported and its workflow driven first.


@pytest.mark.parametrize("cluster", [("redis", "sqlite"), ("redis", "postgres")], indirect=True)
def test_a_failed_step_s_workflow_does_not_wait_behind_the_hand_offs_of_its_slot(cluster: Any, fx: Any) -> None:  # noqa: F811
    """max_running=1: F's step (0.5 s) fails for good while 4 other workflows' steps (1.5 s each)
    wait for the key's slot. F catches the failure and stamps the moment it learnt it: that must
    be right after its step ended (as on success), not after the 4 waiters ran one after another
    in F's process (6 s later, observed 4.0 s with 4 x 1.0 s)."""
    cluster.start_worker(app=APP, concurrency=2)
    key = f"c{uuid.uuid4().hex[:6]}"
    f = hb.catcher.start(key, "F", 0.5)
    wait_until(lambda: any(w == "start" and t == "F" for w, _, _, t in _lines(key)), timeout=60, what="F's step")
    gs = [hb.single.start(key, f"G{i}", 1.5) for i in range(4)]
    assert f.result(timeout=60) == "caught"
    assert [g.result(timeout=60) for g in gs] == [f"G{i}" for i in range(4)]
    late = _at(key, "caught", "F") - _at(key, "end", "F")
    ran_before = sorted(t for w, at, _, t in _lines(key) if w == "end" and t != "F" and at < _at(key, "caught", "F"))
    assert late < 2.0, f"F learnt of its failure {late:.1f}s after it; ran first: {ran_before}"
