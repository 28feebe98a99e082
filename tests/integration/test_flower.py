"""Every activity, drive and timer shows up in a real Flower with a readable name and its task id."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest

from tests.apps import basic
from tests.plugins.workers import REPO, wait_until

pytestmark = pytest.mark.worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tasks(port: int) -> dict[str, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/tasks", timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except OSError:
        return {}


def test_steps_visible_in_flower(cluster) -> None:  # type: ignore[no-untyped-def]
    port = _free_port()
    env = dict(os.environ) | cluster.workers.env | {"FLOWER_UNAUTHENTICATED_API": "true"}
    log = (cluster.workers.tmp / "flower.log").open("wb")
    flower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.apps.basic",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
            "--persistent=False",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until(lambda: flower.poll() is None and _free_port_taken(port), timeout=30, what="flower to listen")
        cluster.start_worker(extra=["-E"])
        flaky_key = "flower"
        h = basic.retry_then_ok.start(flaky_key, 1)
        assert h.result(timeout=60) == "ok after 2"
        s = basic.sleeper.start("flower", 0.2)
        s.result(timeout=60)

        def seen() -> dict[str, dict[str, object]] | None:
            tasks = _tasks(port)
            names = {str(t.get("name")) for t in tasks.values()}
            wanted = [f"tests.apps.basic.flaky [retry_then_ok {h.id} #1]", f"drive [{h.id}]", f"timer [{s.id} #2]"]
            if not all(w in names for w in wanted):
                return None
            # events reach Flower late under load: a step is named by its first event, its end
            # (after the retry) comes later
            ended = {"SUCCESS", "FAILURE"}
            drives = [t for t in tasks.values() if t.get("name") == f"drive [{h.id}]"]
            activity_ended = tasks.get(f"{h.id}:1", {}).get("state") in ended
            return tasks if activity_ended and all(t.get("state") in ended for t in drives) else None

        tasks = wait_until(seen, timeout=60, what="the steps to appear in flower")
        assert isinstance(tasks, dict)
        activity = tasks[f"{h.id}:1"]  # the deterministic task id is the Flower key
        assert activity["name"] == f"tests.apps.basic.flaky [retry_then_ok {h.id} #1]"
        assert activity["state"] == "SUCCESS" and activity["retries"] == 1  # the retry is visible
        drives = [t for t in tasks.values() if t.get("name") == f"drive [{h.id}]"]
        assert drives and all(t["state"] == "SUCCESS" for t in drives)
    finally:
        flower.terminate()
        flower.wait(10)
        log.close()


def _free_port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
