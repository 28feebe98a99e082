"""A Celery app whose workflow code changes by deployment: ``celery -A tests.apps.patching worker``
with ``TEST_PATCH_VERSION`` 1, 2 or 3 (tests/integration/test_patching.py).

1. the original: reserve, then wait for signal ``go``;
2. an ``audit`` activity inserted before the wait, guarded by ``wf.patched("add-audit")``;
3. the same insertion without ``patched`` (executions started on 1 must fail, naming the step).
Configured from the environment like ``tests.apps.basic``.
"""

from __future__ import annotations

import os

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from tests.apps._common import env_app

VERSION = int(os.environ.get("TEST_PATCH_VERSION", "1"))

app = env_app("patching")
durable = Durable(app)


@durable_activity(name="patching.reserve")
def reserve(order: str) -> str:
    return f"reserved {order}"


@durable_activity(name="patching.audit")
def audit(order: str) -> str:
    return f"audited {order}"


def _v1(order: str) -> str:
    done = [reserve(order)]
    done.append(wf.wait_signal("go"))
    return ", ".join(done)


def _v2(order: str) -> str:
    done = [reserve(order)]
    if wf.patched("add-audit"):
        done.append(audit(order))
    done.append(wf.wait_signal("go"))
    return ", ".join(done)


def _v3(order: str) -> str:
    done = [reserve(order), audit(order)]  # changed without patched(): breaks old histories
    done.append(wf.wait_signal("go"))
    return ", ".join(done)


flow = durable.workflow(name="patching.flow", signals={"go": str})({1: _v1, 2: _v2, 3: _v3}[VERSION])
