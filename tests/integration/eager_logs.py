"""What a worker's log says about eager activities (celery_durable/glue/eager_activities.py)."""

from __future__ import annotations

import re

from tests.plugins.workers import Worker


def eager_steps(worker: Worker, execution_id: str) -> list[int]:
    """The steps of ``execution_id`` the worker ran without their message."""
    pattern = re.compile(rf"\({re.escape(execution_id)} step (\d+)\): run here, not sent")
    return sorted(int(m.group(1)) for m in pattern.finditer(worker.log()))


def attempts(worker: Worker, execution_id: str) -> list[int]:
    """The steps of ``execution_id`` whose attempts the worker began (eager or delivered)."""
    pattern = re.compile(rf": {re.escape(execution_id)} step (\d+) attempt \d+")
    return sorted(int(m.group(1)) for m in pattern.finditer(worker.log()))
