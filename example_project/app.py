"""The Celery app and its :class:`~celery_durable.Durable` extension.

Configured from the environment, so the same module serves ``python -m example_project``, a
``celery -A example_project.app worker`` started by hand, and Redis/Cosmos deployments:

==========================  ===============================================================
``EXAMPLE_RUN_DIR``         where the embedded defaults keep their files
                            (default: ``<system temp>/celery-durable-example``;
                            ``python -m example_project`` uses a fresh directory per run)
``EXAMPLE_BROKER_URL``      Celery broker; default ``filesystem://`` with its folders under
                            ``$EXAMPLE_RUN_DIR/broker`` (no server needed)
``EXAMPLE_QUEUE``           queue name (default ``example``)
``DURABLE_STORE_URL``       workflow state; default ``sqlite:///$EXAMPLE_RUN_DIR/durable.db``
``EXAMPLE_READY_FILE``      a worker writes its pid here once it consumes (``worker_ready``)
``EXAMPLE_METRICS_PORT``    a worker serves Prometheus metrics here (``durable_metrics_port``)
==========================  ===============================================================
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from celery import Celery, signals

from celery_durable import Durable

__all__ = ["app", "durable", "RUN_DIR", "BROKER_URL", "STORE_URL", "broker_folders"]

RUN_DIR = Path(os.environ.get("EXAMPLE_RUN_DIR") or Path(tempfile.gettempdir()) / "celery-durable-example")
BROKER_URL = os.environ.get("EXAMPLE_BROKER_URL") or "filesystem://"
STORE_URL = os.environ.get("DURABLE_STORE_URL") or f"sqlite:///{RUN_DIR / 'durable.db'}"
QUEUE = os.environ.get("EXAMPLE_QUEUE") or "example"


def broker_folders(run_dir: Path) -> dict[str, Any]:
    """Transport options of the ``filesystem://`` broker, its folders created under ``run_dir``.

    Producers write to ``data_folder_in`` and consumers read ``data_folder_out``: on one host
    both are the same ``queue`` folder. ``control_folder`` holds the exchange bindings
    (broadcasts such as ``celery inspect``), so two runs never see each other's messages.
    """
    root = run_dir / "broker"
    folders = {name: root / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
        "polling_interval": 0.05,
    }


app = Celery("example_project", broker=BROKER_URL, include=["example_project.activities", "example_project.workflows"])
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    durable_store_url=STORE_URL,
    # Demo timings, so that a crash is recovered in seconds (the defaults are for production: a
    # 30 s lease, a 15 s recovery scan): a killed worker's activity lease lapses after 4 s, beat
    # scans for lapsed leases every second and for due timers twice a second; an unstarted
    # message (lost with a killed worker) is re-sent after 5 s; timers longer than 1 s are fired
    # by beat's clock scan only (shorter ones also get a countdown message).
    durable_lease_ttl=4,
    durable_heartbeat_interval=1,
    durable_recovery_interval=1,
    durable_clock_interval=0.5,
    durable_timer_fast_path_max=1,
    durable_activity_queue_timeout=5,
    durable_drive_timeout=5,
)
if os.environ.get("EXAMPLE_METRICS_PORT"):  # python -m example_project --ui: one port per worker
    app.conf.durable_metrics_port = int(os.environ["EXAMPLE_METRICS_PORT"])
if BROKER_URL.startswith("filesystem:"):
    # kombu's filesystem transport with atomic writes (see celery_durable/glue/filesystem_transport.py)
    app.conf.broker_transport = "celery_durable.contrib.filesystem:Transport"
    app.conf.broker_transport_options = broker_folders(RUN_DIR)
durable = Durable(app)


#: a worker stuck in its shutdown is sent this before it is killed: every process of it (the main
#: process and each pool child) writes the stack of each of its threads to its log (stderr)
STACK_DUMP_SIGNAL = signal.SIGUSR2


@signals.worker_init.connect  # type: ignore[untyped-decorator]
@signals.worker_process_init.connect  # type: ignore[untyped-decorator]
def _dump_stacks_on_signal(**_: object) -> None:
    # faulthandler writes from the signal handler itself, so a process whose main thread is
    # blocked (a lock, a socket read) still shows where; prefork children inherit the worker's
    # stderr, the log file
    faulthandler.register(STACK_DUMP_SIGNAL, file=sys.__stderr__, all_threads=True)


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _write_ready_file(**_: object) -> None:
    ready = os.environ.get("EXAMPLE_READY_FILE")
    if ready:
        Path(ready).write_text(str(os.getpid()))
