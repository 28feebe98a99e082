"""Issue 12 on a real worker: payloads over the store's 2 MB item limit are offloaded into chunk
documents and the execution completes (it used to stay ``running``, re-running the activity)."""

from __future__ import annotations

import pytest

from tests.apps import basic

pytestmark = pytest.mark.worker

MB = 1024 * 1024


def test_big_input_activity_result_and_workflow_result_complete(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    data = "d" * (1100 * 1024)
    h = basic.big_payloads.start("k1", data, 3 * MB)
    assert h.result(timeout=120) == {"input": len(data), "activity": 3 * MB, "echo": len(data) + 3 * MB}
    assert h.status() == "completed"
    assert len((cluster.workers.tmp / "marks" / "blob-k1").read_text().splitlines()) == 1  # ran once
