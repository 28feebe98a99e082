"""``celery beat`` exits 0 on a SIGTERM that lands in the middle of a publish (Redis).

Celery's own handler closed the schedule shelf and the broker connection inside the signal
handler; the interrupted publish then failed as an ordinary error, the loop ticked on against the
closed shelf and beat exited 1 (``invalid operation on closed shelf``) — seen in CI as
``python -m example_project``'s "beat exited with 1".
"""

from __future__ import annotations

import os
import shelve
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugins.workers import REPO, wait_until

pytestmark = pytest.mark.worker


def test_sigterm_mid_publish_exits_cleanly_and_saves_the_schedule(tmp_path: Path) -> None:
    schedule = tmp_path / "beat-schedule"
    log_path = tmp_path / "beat.log"
    env = dict(os.environ) | {
        "TEST_BROKER_URL": "redis://127.0.0.1:6379/14",
        "TEST_QUEUE": f"beat-mid-publish-{os.getpid()}",
        "DURABLE_STORE_URL": f"sqlite:///{tmp_path / 'durable.db'}",
        "TEST_BEAT_ARM_AFTER": "3",
    }
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.apps.beat_mid_publish",
        "beat",
        "-s",
        str(schedule),
        "--loglevel=INFO",
    ]
    with log_path.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: proc.poll() is not None, timeout=60, what="beat to stop on its own SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = log_path.read_text(errors="replace")
    assert "test: SIGTERM sent mid-publish" in log, log[-3000:]
    assert proc.returncode == 0, log[-3000:]
    assert "closed shelf" not in log and "Message Error" not in log, log[-3000:]
    with shelve.open(str(schedule), flag="r") as saved:  # the schedule was still saved on the way out
        assert "celery_durable.fire_due_clocks" in saved["entries"]
