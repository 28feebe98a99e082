"""The recovery, timer and outbox scans run inside ``celery beat`` (``durable_scans_in_beat``).

Sent as beat entries, the three scans were 76 messages a minute through the activity queue on an
idle system (the timer scan every second, the outbox's every 5 s, recovery's every 15 s), 152
lines of worker log, and a scan queued behind two long activities waited for them. Run in the
beat process instead, on a thread of their own at the same intervals, they read the store
directly and send only what they find: the drives, timers and re-sends that are due. An idle
system sends nothing.

One thread per beat process, started by ``beat_init`` (``celery beat`` and a worker's embedded
``-B`` beat alike) for an app with the extension; a scan that fails (a store outage) is logged and
tried again at its next interval. Beat must reach the store, as the workers do.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from celery import signals as celery_signals

from celery_durable.engine.schedules.firing import fire_due
from celery_durable.glue.extension import EXTENSION_ATTR

if TYPE_CHECKING:
    from celery_durable.engine.core import Engine
    from celery_durable.engine.drive.recovery import ScanReport as RecoveryReport
    from celery_durable.engine.outbox.model import ScanReport as OutboxReport

__all__ = ["BeatScans", "clock_pass", "install_beat_scans", "outbox_pass", "recovery_pass"]

log = logging.getLogger("celery_durable.beat")


def recovery_pass(engine: Engine) -> RecoveryReport:
    """One recovery scan (beat's, in its process or as ``celery_durable.recover``), logged when
    it did anything."""
    report = engine.recovery.scan()
    if report.redriven or report.resent or report.failed or report.errors or report.chunks_collected:
        logging.getLogger("celery_durable.tasks").info("recovery: %s", report)  # its logger as a task
    return report


def clock_pass(engine: Engine) -> int:
    """One clock scan (beat's, in its process or as ``celery_durable.fire_due_clocks``): the due
    timers, then the due managed schedules (engine/schedules/firing.py: one more query). Returns
    what fired: timers, and executions started by schedules."""
    return engine.timers.fire_due_clocks() + fire_due(engine)


class _Scanned(Protocol):
    """What :func:`outbox_pass` scans (``glue.outbox.Outbox``, which imports this module)."""

    def scan(self) -> OutboxReport: ...


def outbox_pass(outbox: _Scanned) -> OutboxReport:
    """One outbox liveness scan (beat's, in its process or as ``celery_durable.outbox_scan``),
    logged when it did anything."""
    report = outbox.scan()
    if any(dataclasses.astuple(report)):
        logging.getLogger("celery_durable.outbox").info("outbox scan: %s", report)
    return report


@dataclass
class Scan:
    name: str
    every: float
    run: Callable[[], Any]
    due: float = 0.0


@dataclass
class BeatScans:
    """The scans of one beat process, each at its interval, on one daemon thread."""

    scans: list[Scan]
    stop: threading.Event

    @classmethod
    def of(cls, durable: Any, stop: threading.Event) -> BeatScans:
        settings, engine = durable.settings, durable.engine
        return cls(
            [
                Scan("timers", float(settings.clock_interval), lambda: clock_pass(engine)),
                Scan("outbox", float(settings.outbox_scan_interval), lambda: outbox_pass(durable.outbox)),
                Scan("recovery", float(settings.recovery_interval), lambda: recovery_pass(engine)),
            ],
            stop,
        )

    def _loop(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for scan in self.scans:
                if now >= scan.due:
                    scan.due = now + scan.every
                    try:
                        scan.run()
                    except Exception as exc:  # noqa: BLE001 - a store outage: try again next time
                        log.warning("%s scan failed, tried again in %g s: %s", scan.name, scan.every, exc)
            self.stop.wait(max(0.0, min(scan.due for scan in self.scans) - time.monotonic()))


_STARTED: list[threading.Thread] = []


def _start(durable: Any, stop: threading.Event) -> None:
    """Build the scans (the engine, its store) and run them; a store beat cannot open yet is
    tried again every clock interval, never given up (a receiver of beat_init that raised would
    leave beat without scans for good)."""
    while not stop.is_set():
        try:
            scans = BeatScans.of(durable, stop)
        except Exception as exc:  # noqa: BLE001 - the store down at start-up: try again
            log.warning("celery_durable: cannot start the scans yet, trying again: %s", exc)
            stop.wait(float(durable.settings.clock_interval))
            continue
        log.info("celery_durable: the timer, outbox and recovery scans run in this beat process")
        scans._loop()
        return


def _on_beat_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    durable = getattr(app, EXTENSION_ATTR, None)
    if durable is None or _STARTED:
        return
    settings = durable.settings
    if not (settings.install_beat and settings.scans_in_beat):
        return
    thread = threading.Thread(target=_start, args=(durable, threading.Event()), name="celery-durable-scans")
    thread.daemon = True
    thread.start()
    _STARTED.append(thread)


def install_beat_scans() -> None:
    """Connect the ``beat_init`` receiver (once per process)."""
    celery_signals.beat_init.connect(_on_beat_init, weak=False, dispatch_uid="celery_durable:beat_scans")
