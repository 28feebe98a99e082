"""Start ``celery beat`` for the fault benches (like :func:`_common.start_worker`)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from _common import BENCH_DIR, BenchEnv, Worker, wait_until

__all__ = ["start_beat"]


def start_beat(env: BenchEnv, app: str = "apps.chaosapp", extra_env: dict[str, str] | None = None) -> Worker:
    name = f"beat-{uuid.uuid4().hex[:6]}"
    log_path = env.tmp / f"{name}.log"
    pythonpath = os.pathsep.join(p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p)
    full_env = dict(os.environ) | env.env | (extra_env or {}) | {"PYTHONPATH": pythonpath}
    cmd = [sys.executable, "-m", "celery", "-A", app, "beat", "-s", str(env.tmp / f"{name}.schedule"),
           "--loglevel=INFO", "--max-interval", "1"]  # fmt: skip
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=env.tmp, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    beat = Worker(proc, log_path, name)
    wait_until(lambda: "beat: Starting" in beat.log_tail(100_000), timeout=30, what=f"{name} to start")
    return beat
