"""Issue 27 §5 on real ``celery worker`` processes: a Celery chain into a chord, run durably with
``durable.run(...)``: every task an activity with its own Celery retries (each fails once), the
chord's body given the header's results — on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import chain, chord

from tests.apps import basic

pytestmark = pytest.mark.worker


@pytest.mark.parametrize("cluster", [("redis", "sqlite"), ("redis", "postgres")], indirect=True)
def test_a_chain_into_a_chord_runs_durably_with_its_retries(cluster: Any) -> None:
    cluster.workers.env.update(TEST_MARKS_DIR=str(cluster.workers.tmp / "marks"))
    cluster.start_worker(concurrency=3)
    base = int(uuid.uuid4().int % 10_000) * 100  # fresh (x, y) pairs: each fails exactly once
    canvas = chain(
        basic.cv_add.s(base, 1),
        chord([basic.cv_add.s(i) for i in range(4)], basic.cv_sum.s()),
    )
    h = basic.durable.run(canvas)
    first = base + 1
    assert h.result(timeout=120) == sum(first + i for i in range(4))
