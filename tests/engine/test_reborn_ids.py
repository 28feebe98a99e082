"""Issue 23 item 2 for an id purged and started again (a new life of the id): what its steps send
is new, never taken for what the purged life sent. Before, the new life's default ids were the
purged life's (``<id>:<step>``, ``<sender>:<run>:<step>``): its effect was taken for the old
effect (outbox rows outlive a purge) and its external signal for the old signal (the receiver,
still running, keeps the ids it took), both dropped without a word."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.admin.reruns import reborn, rerun_count
from celery_durable.engine.documents.schema import EXEC_ID
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("reborn-ids-tests", set_as_current=False)
durable = Durable(app, store="memory://")
NOTED: list[Any] = []


@durable.effect("rb.note")
def note(msg: Any) -> None:
    NOTED.append(msg)


@durable.workflow(name="rb.emitter")
def emitter(msg: str) -> str:
    return durable.emit("rb.note", msg)


@durable.workflow(name="rb.desk", signals={"order": str, "close": bool})
def desk() -> list[str]:
    seen: list[str] = []
    while True:
        name, value = wf.wait_any("order", "close")
        if name == "close":
            return seen
        seen.append(str(value))


@durable.workflow(name="rb.customer")
def customer(desk_id: str, what: str) -> str:
    wf.signal_external(desk_id, "order", what)
    return what


def _purge_ended(env: WorkflowEnvironment, by: str = "tests") -> int:
    env.advance(10)
    return Admin(env.engine).purge(5, by=by).purged


def test_each_life_of_an_id_emits_its_own_effect_under_its_own_id() -> None:
    NOTED.clear()
    env = WorkflowEnvironment(durable)
    ids = []
    for life in range(3):
        h = env.start(emitter, f"life {life}", _workflow_id="rb-emit-1")
        ids.append(env.result(h))
        env.advance(10)
        assert NOTED == [f"life {n}" for n in range(life + 1)]
        assert _purge_ended(env) == 1
    assert len(set(ids)) == 3, ids
    assert ids[0] == "rb-emit-1:000001" and ids[1:] == ["rb-emit-1:000001~1", "rb-emit-1:000001~2"]


def test_a_new_life_counts_on_past_the_reruns_of_the_purged_one() -> None:
    """A purged life that was itself re-run (retry/resume/reset: ``~1``, ``~2`` ...) used those
    suffixes too: the next life starts past the highest its purge recorded."""
    env = WorkflowEnvironment(durable)
    env.result(env.start(emitter, "x", _workflow_id="rb-emit-2"))
    store = env.engine.store
    ex = store.read("rb-emit-2", EXEC_ID)
    assert ex is not None
    store.replace({k: v for k, v in ex.items() if k != "_etag"} | {"reruns": 4}, if_match=ex["_etag"])
    assert _purge_ended(env) == 1
    h = env.start(emitter, "y", _workflow_id="rb-emit-2")
    assert env.result(h) == "rb-emit-2:000001~5"
    assert rerun_count(store.read("rb-emit-2", EXEC_ID) or {}) == 5  # written with its first commit


def test_a_new_life_of_a_sender_is_heard_by_a_receiver_that_outlived_the_purge() -> None:
    env = WorkflowEnvironment(durable)
    d = env.start(desk, _workflow_id="rb-desk")
    env.result(env.start(customer, "rb-desk", "book", _workflow_id="rb-cust"))
    assert _purge_ended(env) == 1  # the customer; the desk still runs
    env.result(env.start(customer, "rb-desk", "pen", _workflow_id="rb-cust"))
    env.signal(d, "close", True)
    assert env.result(d) == ["book", "pen"]


def test_reborn_leaves_an_id_never_purged_alone() -> None:
    ex = {"pk": "a", "id": EXEC_ID, "reruns": 2}
    assert reborn(ex, {EXEC_ID: ex}) is ex
    docs = {EXEC_ID: ex, "purged": {"id": "purged", "type": "purged", "reruns": 1}}
    assert reborn(ex, docs) is ex  # already past it
    docs["purged:2"] = {"id": "purged:2", "type": "purged", "reruns": 3}
    assert reborn(ex, docs) == ex | {"reruns": 4}


eapp = Celery("reborn-ids-eager", set_as_current=False)
edurable = Durable(eapp, store="memory://", eager_start=True)
ENOTED: list[Any] = []


@edurable.effect("rb.enote")
def enote(msg: Any) -> None:
    ENOTED.append(msg)


@edurable.workflow(name="rb.eager")
def eager_emitter(msg: str) -> str:
    wf.sleep(1)  # the eager first drive commits this timer, knowing nothing of the purge records
    return edurable.emit("rb.enote", msg)


def test_a_new_life_started_eagerly_still_takes_new_ids() -> None:
    env = WorkflowEnvironment(edurable)
    first = env.result(env.start(eager_emitter, "a", _workflow_id="rb-eager"))
    env.advance(10)
    assert _purge_ended(env) == 1
    second = env.result(env.start(eager_emitter, "b", _workflow_id="rb-eager"))
    env.advance(10)
    assert (first, second) == ("rb-eager:000002", "rb-eager:000002~1")
    assert ENOTED == ["a", "b"]
