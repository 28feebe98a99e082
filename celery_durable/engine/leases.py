"""Heartbeat: one thread per worker process renews the leases of the attempts it runs.

A lease that is not renewed lapses after ``lease_ttl``; the recovery scan then re-sends the
step. A renewal that finds another holder marks the attempt ``lost``: its result may still be
offered, but the first writer wins, so it can never overwrite anything.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ..errors import ConflictError, StoreError
from ..stores.base import strip_reserved
from .model import marker_id

if TYPE_CHECKING:
    from .activity import Attempt
    from .core import Engine

__all__ = ["LeaseKeeper"]

log = logging.getLogger("celery_durable.leases")


class LeaseKeeper:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._attempts: dict[tuple[str, int], Attempt] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def track(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts[(attempt.execution_id, attempt.seq)] = attempt
        self._ensure_thread()

    def untrack(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts.pop((attempt.execution_id, attempt.seq), None)

    def running(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts.values())

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="celery-durable-heartbeat", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop renewing; with ``release`` give back every held lease (graceful shutdown)."""
        self._stop.set()
        if release:
            for attempt in self.running():
                self.release(attempt)

    def _run(self) -> None:
        while not self._stop.wait(self.engine.settings.heartbeat_interval):
            self.renew_all()

    def renew_all(self) -> None:
        for attempt in self.running():
            try:
                self.renew(attempt)
            except StoreError as exc:  # keep beating; the lease may still be ours next time
                log.warning("heartbeat for %s step %d failed: %s", attempt.execution_id, attempt.seq, exc)

    def renew(self, attempt: Attempt) -> bool:
        eng = self.engine
        with attempt.lock:
            marker = eng.store.read(attempt.execution_id, marker_id(attempt.seq, attempt.run))
            lease = (marker or {}).get("lease") or {}
            if marker is None or lease.get("holder") != attempt.holder:
                attempt.lost = True
                self.untrack(attempt)
                eng.emit("lease_lost", execution_id=attempt.execution_id, seq=attempt.seq)
                return False
            expires = eng.clock.now() + eng.settings.lease_ttl
            updated = strip_reserved(marker)
            updated.update(lease={"holder": attempt.holder, "expires": expires}, due_at=expires)
            try:
                attempt.etag = eng.store.replace(updated, if_match=marker["_etag"])
            except ConflictError:
                return False
            return True

    def release(self, attempt: Attempt) -> None:
        """Give the lease back so recovery re-sends the step at once instead of after the TTL."""
        eng = self.engine
        self.untrack(attempt)
        try:
            marker = eng.store.read(attempt.execution_id, marker_id(attempt.seq, attempt.run))
            if marker is None or (marker.get("lease") or {}).get("holder") != attempt.holder:
                return
            updated = strip_reserved(marker)
            updated.update(lease=None, due_at=eng.clock.now())
            eng.store.replace(updated, if_match=marker["_etag"])
        except (ConflictError, StoreError):
            pass
