"""Activity leases: the attempts this process runs, renewed by the process's one heartbeat.

A lease that is not renewed lapses after ``lease_ttl``; the recovery scan then re-sends the
step. A renewal that finds another holder marks the attempt ``lost``: its result may still be
offered, but the first writer wins, so it can never overwrite anything.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from celery_durable.engine.documents.model import marker_id
from celery_durable.engine.documents.records import holder_of
from celery_durable.errors import ConflictError, StoreError
from celery_durable.stores.base import strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.activities.lease_heartbeat import Heartbeat
    from celery_durable.engine.documents.model import Attempt
    from celery_durable.engine.ports import EngineParts

__all__ = ["LeaseKeeper"]

log = logging.getLogger("celery_durable.leases")


def _key(attempt: Attempt) -> tuple[str, int, int, str]:
    return attempt.execution_id, attempt.run, attempt.seq, attempt.holder


class LeaseKeeper:
    """A beater of the engine's :class:`~.heartbeat.Heartbeat`: renews every tracked attempt's
    lease each ``heartbeat_interval``."""

    def __init__(self, engine: EngineParts, heartbeat: Heartbeat) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        # keyed by attempt: a continued execution's run 1 step 3 is not run 0 step 3, and two
        # attempts of one step may overlap here (the old one lost its lease and is finishing)
        self._attempts: dict[tuple[str, int, int, str], Attempt] = {}
        self._last_beat = 0.0
        self._heartbeat = heartbeat
        heartbeat.add(self)

    def track(self, attempt: Attempt) -> None:
        with self._lock:
            if not self._attempts:  # the first renewal is one interval after the first track
                self._last_beat = time.monotonic()
            self._attempts[_key(attempt)] = attempt
            first_beat = self._last_beat + self.engine.settings.heartbeat_interval
        self._heartbeat.wake(first_beat)

    def untrack(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts.pop(_key(attempt), None)

    def running(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts.values())

    def stop(self, release: bool = True) -> None:
        """Stop renewing (the heartbeat thread too); with ``release`` give back every held lease."""
        self._heartbeat.stop()
        if release:
            for attempt in self.running():
                self.release(attempt)

    # --- Beater ------------------------------------------------------------------------------

    def next_beat(self, now: float) -> float | None:
        with self._lock:
            if not self._attempts:
                return None
        return self._last_beat + self.engine.settings.heartbeat_interval

    def beat(self) -> None:
        self._last_beat = time.monotonic()
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
            if marker is None or holder_of(marker) != attempt.holder:
                return
            updated = strip_reserved(marker)
            updated.update(lease=None, due_at=eng.clock.now())
            eng.store.replace(updated, if_match=marker["_etag"])
        except (ConflictError, StoreError):
            pass
