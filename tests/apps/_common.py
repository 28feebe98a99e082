"""What every test app shares: a Celery app configured from the environment (each test points it
at its own broker, queue and store) and the ready file a test awaits before it sends anything."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals


def mark_in(marks: Path, name: str) -> int:
    """Append this process's pid to the marks file ``name`` (shared by the test and its workers);
    return how many lines it now has."""
    marks.mkdir(parents=True, exist_ok=True)
    path = marks / name
    with path.open("a") as fh:
        fh.write(f"{os.getpid()}\n")
    return len(path.read_text().splitlines())


def gate_in(marks: Path, name: str, timeout: float = 60.0) -> None:
    """Wait (in a worker) until the test creates the marks file ``name``."""
    deadline = time.monotonic() + timeout
    while not (marks / name).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {name} never opened")
        time.sleep(0.02)


def note_in(marks: Path, name: str, doc: dict[str, Any]) -> None:
    """Append one JSON line to the marks file ``name``."""
    marks.mkdir(parents=True, exist_ok=True)
    with (marks / name).open("a") as fh:
        fh.write(json.dumps(doc) + "\n")


def notes_in(marks: Path, name: str) -> list[dict[str, Any]]:
    """The JSON lines of the marks file ``name`` (none if it does not exist)."""
    path = marks / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def env_float(name: str, default: str) -> float:
    return float(os.environ.get(name, default))


def env_app(name: str, **conf: Any) -> Celery:
    """A JSON-only Celery app on ``$TEST_BROKER_URL`` / ``$TEST_QUEUE`` with the lease settings
    from the environment; ``conf`` adds or overrides settings."""
    app = Celery(name, broker=os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:6379/15"))
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
        broker_transport_options=json.loads(os.environ.get("TEST_BROKER_OPTIONS") or "{}"),
        durable_lease_ttl=env_float("TEST_LEASE_TTL", "30"),
        durable_heartbeat_interval=env_float("TEST_HEARTBEAT", "10"),
        **conf,
    )
    if app.conf.broker_url.startswith("filesystem"):
        # kombu's own filesystem transport can hand a consumer a half-written message
        app.conf.broker_transport = "celery_durable.contrib.filesystem:Transport"
    return app


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _ready(**_: object) -> None:
    ready = os.environ.get("TEST_READY_FILE")
    if ready:
        Path(ready).write_text(str(os.getpid()))
