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

from celery import Celery, signals

from celery_durable import Durable
from celery_durable.outbox import effect_context

app = Celery("adversarial_effects", broker=os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:6379/15"))
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    durable_lease_ttl=float(os.environ.get("TEST_LEASE_TTL", "30")),
    durable_heartbeat_interval=float(os.environ.get("TEST_HEARTBEAT", "10")),
    durable_outbox_scan_interval=float(os.environ.get("TEST_OUTBOX_SCAN", "5")),
    durable_outbox_queue_timeout=float(os.environ.get("TEST_OUTBOX_QUEUE_TIMEOUT", "60")),
    durable_outbox_cancel_poll=float(os.environ.get("TEST_OUTBOX_CANCEL_POLL", "1")),
)
durable = Durable(app)


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _ready(**_: object) -> None:
    ready = os.environ.get("TEST_READY_FILE")
    if ready:
        Path(ready).write_text(str(os.getpid()))


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
