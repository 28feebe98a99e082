"""``durable update ID NAME --value JSON`` (celery_durable/cli/update_commands.py): the answer once
the workflow handled it, exit status 1 with the reason when it is rejected, refused or not handled
in time. The workflow is driven here by a WorkflowEnvironment on the app's (memory) store."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_durable.engine.documents.update_docs import update_request_id
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment
from tests.apps import basic


def cli(*args: str) -> Result:
    return CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", *args])


@pytest.fixture
def env() -> Any:
    store = MemoryStore()
    basic.durable.configure(store=store)
    yield WorkflowEnvironment(basic.durable, store=store)
    basic.durable.configure(store=None)


def _answered(env: WorkflowEnvironment, eid: str, *args: str) -> Result:
    """Run the CLI in a thread and drive the execution here once its request is stored."""
    got: list[Result] = []
    caller = threading.Thread(target=lambda: got.append(cli("update", eid, *args)))
    caller.start()
    while caller.is_alive():
        if env.store.read(eid, update_request_id(1)) is not None or env.store.read(eid, update_request_id(2)):
            env.engine.dispatcher.send_drive(eid)
            env.run_until_idle()
        caller.join(timeout=0.01)
    return got[0]


def test_an_update_from_the_cli_prints_the_answer_or_why_not(env: WorkflowEnvironment) -> None:
    h = env.start(basic.updatable, 10)
    done = _answered(env, h.id, "bump", "--value", "5", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {"id": h.id, "action": "update", "name": "bump", "answer": 18}
    shown = cli("show", h.id)  # the timeline shows the update step and the activity's values
    assert shown.exit_code == 0 and "fill" in shown.output, shown.output
    (row,) = [line for line in shown.output.splitlines() if " update " in line]
    assert "bump" in row and "recorded" in row  # applied, not "pending"
    rejected = _answered(env, h.id, "bump", "--value", "-1")
    assert rejected.exit_code == 1 and "positive amount" in rejected.output
    bad = cli("update", h.id, "bump", "--value", "{nope")
    assert bad.exit_code == 1 and "not valid JSON" in bad.output
    missing = cli("update", "no-such-id", "bump", "--value", "1")
    assert missing.exit_code == 1 and "no execution" in missing.output
    late = cli("update", h.id, "bump", "--value", "1", "--timeout", "0.05")  # nobody drives it
    assert late.exit_code == 1 and "not handled after" in late.output
    env.signal(h, "stop", True)
    ended = cli("update", h.id, "bump", "--value", "1")
    assert ended.exit_code == 1 and "has ended" in ended.output
