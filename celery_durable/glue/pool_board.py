"""What a worker's main process tells the processes that run eager activities, and back.

An eager activity (glue/eager_activities.py) runs in the pool process of the delivery that kept
it. In a prefork worker that is a child, forked at start-up, which never sees what the main
process handles: the control messages (``revoke``, ``enable_events``) and the shutdown signal.
For a delivered task Celery needs none of that in the child (the main process discards a revoked
message, sends the task events, stops handing out messages, kills the child running a task
revoked with ``terminate``). For a kept one the child must ask, so the main process writes what
it learns to a :class:`Board`: one anonymous shared memory map, made before the pool forks and
inherited by every child (in a threads or solo worker, the same process reads it).

- ``stopping``: a warm or cold shutdown began (``worker_shutting_down``): no more kept runs.
- ``task_events``: the worker sends task events (``-E``, ``worker_send_task_events``, Flower's
  or ``celery control enable_events``): an eager run sends its own.
- revoked ids: a ring of the last :data:`RING` revoked task ids (as digests) that a kept run's
  id is looked up in before it starts.
- running: per pool process, the pid and the id of the eager run it is in, so ``revoke(id,
  terminate=True)`` kills that process as Celery kills the one running a delivered task.
- rate limits set at run time (``celery control rate_limit``): the consumer enforces those on
  messages, so a task that has one is sent, not kept.

Nothing here is durable: it is the worker's view, as Celery's own revoked set is. The main
process learns of control messages by wrapping Celery's handlers (``Panel.data``).
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Board", "board", "install", "note_task_events"]

log = logging.getLogger("celery_durable.worker")

#: revoked ids remembered (16-byte digests: 64 KiB)
RING = 4096
#: pool processes whose eager run ``terminate`` can find (a prefork child's index, else its pid)
SLOTS = 256
_DIGEST = 16
#: rate limits set at run time (``celery control rate_limit``) remembered, the last per task wins
RATES = 256
_HEADER = 64  # [0] stopping, [1] task events, [8:16] revoked ids written, [16:24] rate limits written (u64)
_SLOT = 24  # pid (u32), 4 bytes unused, digest
_RATE = 24  # digest of the task name, then 1: limited, 2: unlimited
_RING_AT = _HEADER + SLOTS * _SLOT
_RATES_AT = _RING_AT + RING * _DIGEST
_SIZE = _RATES_AT + RATES * _RATE


def _digest(task_id: str) -> bytes:
    return hashlib.blake2b(task_id.encode("utf-8", "surrogatepass"), digest_size=_DIGEST).digest()


def _slot_index() -> int:
    """This pool process's slot: a prefork child's index (Celery numbers them 0..concurrency-1,
    reused for a replacement), else the pid."""
    try:
        from billiard.process import current_process

        index = getattr(current_process(), "index", None)
    except Exception:  # noqa: BLE001 - no billiard context: use the pid
        index = None
    return int(index) % SLOTS if isinstance(index, int) else os.getpid() % SLOTS


class Board:
    """The shared map (see the module docstring). Single bytes and whole digests are written
    with one slice assignment each; a reader that races a write sees the old or the new value of
    a flag, and at worst misses a revoke made in the same instant (as a delivered task that
    started just before its revoke is missed)."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, _SIZE, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_ANONYMOUS", 0x20))
        self._lock = threading.Lock()  # writers of the rings: the main process's control handlers

    # -- main process --------------------------------------------------------------------
    def set_stopping(self) -> None:
        self._map[0:1] = b"\x01"

    def set_task_events(self, on: bool) -> None:
        self._map[1:2] = b"\x01" if on else b"\x00"

    def _append(self, count_at: int, start: int, slots: int, width: int, records: list[bytes]) -> None:
        """Write ``records`` into the ring of ``slots`` records of ``width`` bytes at ``start``,
        after the last one written (the header's counter at ``count_at``), the oldest overwritten."""
        with self._lock:
            (written,) = struct.unpack_from("<Q", self._map, count_at)
            for record in records:
                at = start + (written % slots) * width
                self._map[at : at + len(record)] = record
                written += 1
            struct.pack_into("<Q", self._map, count_at, written)

    def revoke(self, task_ids: list[str]) -> None:
        self._append(8, _RING_AT, RING, _DIGEST, [_digest(task_id) for task_id in task_ids])

    def set_rate_limited(self, task_name: str, limited: bool) -> None:
        record = _digest(task_name) + (b"\x01" if limited else b"\x02")
        self._append(16, _RATES_AT, RATES, _RATE, [record])

    def running_pids(self, task_id: str) -> list[int]:
        """The pool processes whose current eager run is ``task_id``."""
        digest, pids = _digest(task_id), []
        for i in range(SLOTS):
            at = _HEADER + i * _SLOT
            (pid,) = struct.unpack_from("<I", self._map, at)
            if pid and self._map[at + 8 : at + 8 + _DIGEST] == digest:
                pids.append(pid)
        return pids

    # -- the process running eager activities --------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._map[0] == 1

    @property
    def task_events(self) -> bool:
        return self._map[1] == 1

    def revoked(self, task_id: str) -> bool:
        (written,) = struct.unpack_from("<Q", self._map, 8)
        if not written:  # asked before every eager run: most workers never see a revoke
            return False
        # searched in place (a slice would copy the whole ring on every run)
        digest, end = _digest(task_id), _RING_AT + min(written, RING) * _DIGEST
        at = self._map.find(digest, _RING_AT, end)
        while at != -1:
            if (at - _RING_AT) % _DIGEST == 0:
                return True
            at = self._map.find(digest, at + 1, end)
        return False

    def rate_limited(self, task_name: str) -> bool | None:
        """Whether a rate limit set at run time applies to ``task_name`` (None: none was set)."""
        digest, found = _digest(task_name), None
        (written,) = struct.unpack_from("<Q", self._map, 16)
        for n in range(max(0, written - RATES), written):  # oldest first: the last one wins
            at = _RATES_AT + (n % RATES) * _RATE
            if self._map[at : at + _DIGEST] == digest:
                found = self._map[at + _DIGEST] == 1
        return found

    @contextmanager
    def running(self, task_id: str) -> Iterator[None]:
        """Announce this process's eager run of ``task_id`` while it runs (for ``terminate``)."""
        at = _HEADER + _slot_index() * _SLOT
        self._map[at : at + _SLOT] = struct.pack("<I4x", os.getpid()) + _digest(task_id)
        try:
            yield
        finally:
            self._map[at : at + _SLOT] = bytes(_SLOT)


_BOARD: Board | None = None


def board() -> Board | None:
    """This worker's board (``None`` outside a worker, or before :func:`install`)."""
    return _BOARD


def note_task_events(dispatcher: Any) -> None:
    """Record whether ``dispatcher`` (the consumer's) sends task events."""
    if _BOARD is None:
        return
    # as EventDispatcher.send decides: no groups means every group
    on = bool(dispatcher is not None and dispatcher.enabled and (not dispatcher.groups or "task" in dispatcher.groups))
    _BOARD.set_task_events(on)


def _wrap(name: str, after: Callable[..., None]) -> None:
    """Run ``after(state, *args, **kwargs)`` after Celery's control handler ``name``."""
    from celery.worker.control import Panel

    original = Panel.data.get(name)
    if original is None or getattr(original, "celery_durable", False):
        return

    def handler(state: Any, *args: Any, **kwargs: Any) -> Any:
        reply = original(state, *args, **kwargs)
        try:
            after(state, *args, **kwargs)
        except Exception:  # noqa: BLE001 - the board must never break a control command
            log.exception("celery_durable: could not note control command %s", name)
        return reply

    handler.celery_durable = True  # type: ignore[attr-defined]
    for attr in ("__name__", "__doc__", "__qualname__"):
        setattr(handler, attr, getattr(original, attr, None))
    Panel.data[name] = handler


def _after_revoke(state: Any, task_id: Any = None, terminate: bool = False, signal: Any = None, **_: Any) -> None:
    if _BOARD is None:
        return
    ids = [task_id] if isinstance(task_id, str) else [str(t) for t in (task_id or ())]
    _BOARD.revoke(ids)
    if not terminate:
        return
    from celery.platforms import signals as platform_signals

    signum = platform_signals.signum(signal or "TERM")
    for task in ids:
        for pid in _BOARD.running_pids(task):
            if pid == os.getpid():
                continue  # a threads/solo worker: no process to kill, as for its delivered tasks
            log.info("Terminating eager activity %s in process %d (%s)", task, pid, signum)
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                continue
            # as Celery announces a task it terminates (Request._announce_revoked)
            dispatcher = getattr(getattr(state, "consumer", None), "event_dispatcher", None)
            if dispatcher is not None and dispatcher.enabled:
                dispatcher.send("task-revoked", uuid=task, terminated=True, signum=signum, expired=False)


def _after_rate_limit(state: Any, task_name: Any = None, rate_limit: Any = None, **_: Any) -> None:
    """``celery control rate_limit``: the main process's task has it now, a prefork child's not."""
    if _BOARD is None or not isinstance(task_name, str):
        return
    from celery.utils.time import rate

    try:
        limited = rate(rate_limit) > 0
    except (TypeError, ValueError):
        return  # refused by Celery's handler too
    if task_name in state.app.tasks:
        _BOARD.set_rate_limited(task_name, limited)


def _after_events(state: Any, *_: Any, **__: Any) -> None:
    note_task_events(getattr(state.consumer, "event_dispatcher", None))


def install() -> Board:
    """Make this process's board: in a worker's main process, before the pool forks."""
    global _BOARD
    if _BOARD is None:
        _BOARD = Board()
        from celery import signals

        signals.worker_shutting_down.connect(_on_shutting_down, weak=False, dispatch_uid="celery_durable.board")
        _wrap("revoke", _after_revoke)
        _wrap("rate_limit", _after_rate_limit)
        _wrap("enable_events", _after_events)
        _wrap("disable_events", _after_events)
    return _BOARD


def _on_shutting_down(**_: Any) -> None:
    if _BOARD is not None:
        _BOARD.set_stopping()
