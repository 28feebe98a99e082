"""A Celery app for tests/integration/test_adversarial_outbox.py: ``celery -A tests.apps.adversarial_effects worker``.

Configured from the environment like ``tests.apps.effects``; handlers append one JSON line per
run to ``$TEST_MARKS_DIR/adv.log``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery_durable import Durable
from celery_durable.glue.outbox import effect_context
from tests.apps._common import env_app, env_float

app = env_app(
    "adversarial_effects",
    durable_outbox_scan_interval=env_float("TEST_OUTBOX_SCAN", "5"),
    durable_outbox_queue_timeout=env_float("TEST_OUTBOX_QUEUE_TIMEOUT", "60"),
    durable_outbox_cancel_poll=env_float("TEST_OUTBOX_CANCEL_POLL", "1"),
)
durable = Durable(app)


def log_run(event: str) -> None:
    ctx = effect_context()
    line = {"event": event, "id": ctx.effect_id, "attempt": ctx.attempt, "pid": os.getpid(), "t": time.time()}
    folder = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "adv.log").open("a") as fh:
        fh.write(json.dumps(line) + "\n")


@durable.effect("adv.step", timeout=1.0, replay_safe=False)
def step(payload: dict[str, Any]) -> None:
    """Well inside its 1 s timeout: 0.8 s of blocking work."""
    log_run("start")
    time.sleep(float(payload.get("sleep", 0.8)))
    log_run("end")
