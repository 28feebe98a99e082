"""What a test sees of Celery's task events and of a worker's processes."""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

from tests.plugins.workers import wait_until

__all__ = ["Events", "process_gone"]


class Events:
    """Every event on the app's broker, captured by Celery's own receiver (as Flower does)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[dict[str, Any]] = []
        self.conn = app.connection_for_read()
        self.receiver = app.events.Receiver(self.conn, handlers={"*": self.seen.append})
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> Events:
        self.thread.start()
        probe = uuid.uuid4().hex
        with self.app.events.default_dispatcher() as dispatcher:

            def ready() -> bool:
                dispatcher.send("custom-probe", probe=probe)
                return any(e.get("probe") == probe for e in self.seen)

            wait_until(ready, timeout=30, interval=0.2, what="the event receiver to consume")
        return self

    def __exit__(self, *exc: object) -> None:
        self.receiver.should_stop = True
        self.thread.join(10)
        self.conn.release()

    def of(self, task_id: str) -> list[dict[str, Any]]:
        """The events of one task, as received."""
        return [e for e in list(self.seen) if e.get("uuid") == task_id]

    def types(self, task_id: str) -> list[str]:
        return [e["type"] for e in self.of(task_id)]


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
