"""``celery -A apps.longapp worker`` for ``bench/long.py --workers``: the bench app, plus each pool
process writing its sticky cache counters (engine/replay/sticky.py) to ``$BENCH_STICKY_DIR/<pid>.json``
after every task, so the bench can sum how often a drive found the instance alive."""

from __future__ import annotations

import json
import os
from pathlib import Path

from celery import signals

from apps.benchapp import app, durable, sequential

__all__ = ["app", "durable", "sequential"]


@signals.task_postrun.connect  # type: ignore[untyped-decorator]
def _dump_sticky(**_: object) -> None:
    folder = os.environ.get("BENCH_STICKY_DIR")
    engine = durable.engine_if_built  # a property: None until this process built its engine
    if folder and engine is not None:
        Path(folder, f"{os.getpid()}.json").write_text(json.dumps(dict(engine.driver.sticky.stats)))
