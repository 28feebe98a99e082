"""Issue 13 items 3, 4 and 6 on real workers (tests/integration/test_channels.py): local
activities, ``wf.signal_external`` and an operator's reset. Configured like ``tests.apps.basic``."""

from __future__ import annotations

from pathlib import Path

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from tests.apps._common import env_app

app = env_app("channels")
durable = Durable(app)


@durable_activity(name="channels.inc", local=True)
def inc(x: int) -> int:
    return x + 1


@durable_activity(name="channels.check")
def check(path: str) -> str:
    if not Path(path).exists():
        raise ValueError(f"{path} is missing")
    return "found"


@durable.workflow(name="channels.three")
def three(x: int) -> int:
    return inc(inc(inc(x)))


@durable.workflow(name="channels.guarded")
def guarded(path: str) -> list[object]:
    return [inc(1), check(path)]


@durable.workflow(name="channels.receiver", signals={"go": str, "stop": str})
def receiver() -> str:
    name, value = wf.wait_any("go", "stop")
    return f"{name}:{value}"


@durable.workflow(name="channels.sender")
def sender(target: str) -> str:
    wf.signal_external(target, "go", "from a workflow")
    return "sent"
