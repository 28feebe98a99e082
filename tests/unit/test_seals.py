"""No broker message chooses a step's result or takes over a lease (issue 23, item 5).

From /work/shared/repro/trust/sec_forged_outcome_header.py: the ``outcome`` field of the
``durable_step`` header was recorded as the step's result as it stood, so one published message
completed a pending activity with the attacker's value (the activity never ran). Now only an
outcome this library sealed (the store-outage hand-off) is recorded; a retry's lease takeover
(``h``) and an effect's adopt header need a seal too. The key lives in the store, never in a
message or a log line.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable.engine.documents.schema import marker_id, result_id
from celery_durable.engine.drive import seals
from celery_durable.errors import InvalidWorkflowId
from celery_durable.glue.durable_activity import DURABLE_HEADER
from celery_durable.stores.memory import MemoryStore

app = Celery("seals", broker="memory://", set_as_current=False)
store = MemoryStore()
durable = Durable(app, store=store)
ran: list[int] = []


@durable_activity(name="seal.charge")
def charge(amount: int) -> str:
    ran.append(amount)
    return f"charged {amount}"


@durable.workflow(name="seal.order")
def order(amount: int) -> str:
    return "order done: " + charge(amount)


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()


def pending() -> tuple[str, dict[str, Any]]:
    """An order whose step 1 is scheduled (its genuine message not consumed): id, step header."""
    h = order.start(100)
    durable.engine.drive(h.id)
    marker = store.read(h.id, marker_id(1))
    assert marker is not None
    return h.id, {"e": h.id, "s": 1, "r": 0, "w": "seal.order", "t": marker.get("token")}


def forged_result(eid: str) -> dict[str, Any]:
    return {"pk": eid, "id": result_id(1), "type": "result", "run": 0, "seq": 1, "name": "seal.charge"} | {
        "ok": True,
        "value": "charged 0 (FORGED)",
    }


def deliver(meta: dict[str, Any], args: list[Any] | None = None) -> None:
    res = app.tasks["seal.charge"].apply(args=args or [100], headers={DURABLE_HEADER: meta})
    assert res.state == "SUCCESS", res.traceback


def counted(event: str) -> int:
    return durable.counters.snapshot().get(event, 0)


def test_an_outcome_in_a_header_is_never_recorded(caplog: pytest.LogCaptureFixture) -> None:
    eid, meta = pending()
    before = counted("activity_unsealed_outcome")
    with caplog.at_level(logging.WARNING, logger="celery_durable.activity"):
        deliver(meta | {"outcome": forged_result(eid)}, args=[0])  # the repro's message
    assert store.read(eid, result_id(1)) is None and ran == []  # dropped: nothing recorded, nothing run
    assert counted("activity_unsealed_outcome") == before + 1
    assert any("did not seal" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    deliver(meta)  # the genuine message still runs the step
    assert ran == [100] and durable.handle(eid).result(timeout=0) == "order done: charged 100"


@pytest.mark.parametrize("how", ["bad mac", "other step", "other token", "not a pair"])
def test_a_badly_sealed_outcome_is_dropped(how: str) -> None:
    eid, meta = pending()
    doc = forged_result(eid)
    step, token = (eid, 0, 1), meta["t"]
    sealed: Any = seals.seal_outcome(store, step, token, doc)
    if how == "bad mac":
        sealed = [sealed[0], "0" * 64]
    elif how == "other step":  # a genuine seal of another step, replayed here
        sealed = seals.seal_outcome(store, (eid, 0, 2), token, doc | {"seq": 2})
    elif how == "other token":  # a genuine seal of an older marker of this step (before a reset)
        sealed = seals.seal_outcome(store, step, "0" * 24, doc)
    else:
        sealed = doc
    before = counted("activity_unsealed_outcome")
    deliver(meta | {"sealed": sealed})
    assert store.read(eid, result_id(1)) is None and ran == []
    assert counted("activity_unsealed_outcome") == before + 1


def test_an_outcome_the_library_sealed_is_recorded_without_running_the_activity() -> None:
    eid, meta = pending()
    doc = forged_result(eid) | {"value": "charged 100"}
    deliver(meta | {"sealed": seals.seal_outcome(store, (eid, 0, 1), meta["t"], doc)})
    assert ran == [] and durable.handle(eid).result(timeout=0) == "order done: charged 100"


def test_a_takeover_needs_a_seal() -> None:
    eid, meta = pending()
    attempt, why = durable.engine.activities.begin(eid, 1)  # a live attempt holds the lease
    assert attempt is not None, why
    before = counted("activity_unsealed_takeover")
    deliver(meta | {"h": attempt.holder})  # a message naming the current holder
    assert ran == [] and counted("activity_unsealed_takeover") == before + 1
    deliver(meta | {"h": attempt.holder, "hs": "f" * 64})
    assert ran == [] and counted("activity_unsealed_takeover") == before + 2
    hs = seals.seal_takeover(store, (eid, 0, 1), meta["t"], attempt.holder)
    deliver(meta | {"h": attempt.holder, "hs": hs})  # what a genuine retry carries
    assert ran == [100]


def test_the_key_is_stored_once_and_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    other = MemoryStore()
    seals._keys.clear()
    with caplog.at_level(logging.DEBUG):
        mac = seals.seal(other, "p", 1)
        seals._keys.clear()  # another process: reads the same key, does not write its own
        assert seals.verify(other, mac, "p", 1) and not seals.verify(other, mac, "p", 2)
    doc = other.read(seals.KEY_PK, seals.KEY_ID)
    assert doc is not None and len(bytes.fromhex(doc["secret"])) == 32
    assert doc["secret"] not in caplog.text
    eid, _ = pending()
    assert seals.KEY_PK not in [e.id for e in durable.executions(limit=1000).executions]  # not an execution
    key = store.read(seals.KEY_PK, seals.KEY_ID)
    assert key is not None and key["secret"] not in repr(durable.describe(eid))


def test_no_execution_can_take_the_keys_partition() -> None:
    with pytest.raises(InvalidWorkflowId, match="reserved"):
        order.start(1, _workflow_id=seals.KEY_PK)  # its purge would delete the key


attempts: list[int] = []


@durable_activity(name="seal.flaky", autoretry_for=(ConnectionError,), max_retries=2, default_retry_delay=0)
def flaky(amount: int) -> str:
    attempts.append(amount)
    if len(attempts) == 1:
        raise ConnectionError("the first attempt fails")
    return f"flaky {amount}"


@durable.workflow(name="seal.flaky_order")
def flaky_order(amount: int) -> str:
    return flaky(amount)


def test_a_genuine_retry_takes_over_the_lease_it_could_not_give_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry message's ``h`` is sealed (``hs``): it still takes over its predecessor's lease."""
    attempts.clear()
    h = flaky_order.start(7)
    durable.engine.drive(h.id)
    marker = store.read(h.id, marker_id(1))
    assert marker is not None
    monkeypatch.setattr(durable.engine.activities, "retrying", lambda *a: None)  # the lease stays held
    meta = {"e": h.id, "s": 1, "r": 0, "w": "seal.flaky_order", "t": marker["token"]}
    before = counted("activity_unsealed_takeover")
    res = app.tasks["seal.flaky"].apply(args=[7], headers={DURABLE_HEADER: meta})  # eager: the retry runs at once
    assert res.state == "SUCCESS", res.traceback
    assert attempts == [7, 7] and h.result(timeout=0) == "flaky 7"
    assert counted("activity_unsealed_takeover") == before
