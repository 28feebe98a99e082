"""``celery -A proj durable limit show NAME --key KEY``: an operator sees who holds a limit's slots
and who waits, in the order they will be granted; a limit no step used is a clear error."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_durable.stores.memory import MemoryStore
from tests.apps import basic


def _cli(*args: str) -> Result:
    return CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", *args])


@pytest.fixture
def memory() -> Iterator[MemoryStore]:
    store = MemoryStore()
    basic.durable.configure(store=store)
    yield store
    basic.durable.configure(store=None)


def _record(priority: int = 0, group: str = "g") -> dict[str, object]:
    return {"name": "stripe", "key": "cus_1", "max": 1, "rate": None, "p": priority, "g": group, "d": 0.0}


def test_show_lists_the_holder_and_the_queue_in_grant_order(memory: MemoryStore) -> None:
    slots = basic.durable.engine.limits
    assert slots.enter("holder", 0, 1, 1, _record()) is None
    assert slots.enter("late", 0, 1, 1, _record(priority=0, group="B")) is not None  # waits
    assert slots.enter("urgent", 0, 1, 1, _record(priority=-1, group="C")) is not None  # waits, goes first
    out = _cli("limit", "show", "stripe", "--key", "cus_1")
    assert out.exit_code == 0, out.output
    assert "max_running 1" in out.output and "room now 0" in out.output
    assert out.output.index("holder") < out.output.index("urgent") < out.output.index("late")
    data = json.loads(_cli("limit", "show", "stripe", "--key", "cus_1", "--json").output)
    assert [h["execution_id"] for h in data["holders"]] == ["holder"]
    assert [w["execution_id"] for w in data["waiting"]] == ["urgent", "late"]


def test_an_unknown_limit_is_a_clear_error(memory: MemoryStore) -> None:
    out = _cli("limit", "show", "nope", "--key", "x")
    assert out.exit_code != 0
    assert "no document for key 'x'" in out.output


def test_show_names_workflow_executions_holding_and_waiting(memory: MemoryStore) -> None:
    """Executions of a limited workflow hold and wait too: shown as ``workflow``, not a step
    number (their entries have none: a parse of one as a step used to fail the command)."""
    slots = basic.durable.engine.limits
    waiter = {"s": "wf-a|wf", "e": "wf-a", "r": 0, "q": 0, "n": 1, "t": None, "p": 0, "g": "", "w": 1}
    assert slots.join(_record(), waiter) is True
    assert slots.join(_record(), waiter | {"s": "wf-b|wf", "e": "wf-b"}) is False
    out = _cli("limit", "show", "stripe", "--key", "cus_1")
    assert out.exit_code == 0, out.output
    assert "wf-a" in out.output and "wf-b" in out.output and "workflow" in out.output
    data = json.loads(_cli("limit", "show", "stripe", "--key", "cus_1", "--json").output)
    held = data["holders"][0]
    assert (held["execution_id"], held["seq"], held["kind"], held["group"]) == ("wf-a", None, "workflow", "")
    assert [(w["execution_id"], w["kind"]) for w in data["waiting"]] == [("wf-b", "workflow")]
