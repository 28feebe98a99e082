"""Found by the adversarial review: typed ``*args`` / ``**kwargs`` of workflows and activities lose their type.

README: "Payloads are validated with pydantic from the type hints ... Dates, decimals, enums
and models survive restarts." A hint on ``*args``/``**kwargs`` is ignored by ``CallCodec``
(``celery_durable/codecs.py``: ``self._var = ValueCodec(Any)``), so a ``date`` comes back as a
``str`` and a bad value is accepted silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, PayloadValidationError, durable_activity
from celery_durable.codecs import CallCodec
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("adv-codecs", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow(name="adv.codecs.days")
def days(first: date, *more: date, **prices: Decimal) -> str:
    # the workflow body sees what replay decoded from the stored payload
    kinds = [type(first).__name__] + [type(d).__name__ for d in more]
    kinds += [f"{k}={type(v).__name__}" for k, v in sorted(prices.items())]
    return ",".join(kinds)


def test_typed_var_positional_and_var_keyword_survive_the_store() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(days, date(2024, 1, 1), date(2024, 1, 2), fee=Decimal("1.50"))
    # a date passed as *more must come back a date, a Decimal in **prices a Decimal
    assert env.result(h) == "date,date,fee=Decimal"


def test_bad_var_positional_value_is_refused_in_the_caller() -> None:
    codec = CallCodec(days.definition.fn)
    with pytest.raises(PayloadValidationError):
        codec.encode_args((date(2024, 1, 1), "not a date"), {})


@durable.workflow(name="adv.codecs.stats")
def stats(readings: dict) -> float:  # type: ignore[type-arg]  # an untyped container, on purpose
    return float(readings["max"])


def test_untyped_container_keeps_infinity_or_refuses_it() -> None:
    """An ``inf`` inside an untyped ``dict`` payload silently becomes ``None`` (pydantic's
    ``Any`` serializer in JSON mode), while a typed ``float`` keeps it: the workflow then sees a
    different value than the caller passed. Either keep it or refuse it in the caller."""
    import math

    env = WorkflowEnvironment(durable)
    try:
        h = env.start(stats, {"max": math.inf})
    except PayloadValidationError:
        return  # refused in the caller: fine
    stored = env.engine.read_exec(h.id)["payload"]["args"][0]["max"]
    assert stored is not None, "inf was silently stored as null"
    assert env.result(h) == math.inf


@dataclass
class Reading:
    value: float


@durable.workflow(name="adv.codec.dc.echo")
def echo(reading: Any) -> str:
    return repr(reading)


def test_nan_in_dataclass_under_any_is_refused_not_turned_into_none() -> None:
    env = WorkflowEnvironment(durable)
    try:
        h = env.start(echo, Reading(value=math.nan))
    except PayloadValidationError:
        return  # refused in the caller: fine
    seen = env.result(h)
    # the workflow must not see a different value than the caller passed (nan -> None)
    assert "None" not in seen, f"nan silently became None: workflow saw {seen}"


# --- issue 12: values JSON cannot carry faithfully are refused at every boundary -----------------
#
# Before: an untyped set arrived as a list, bytes as str, int keys as str keys; non-UTF-8 bytes
# raised a raw UnicodeDecodeError; integers beyond 2^53 were stored (and lose precision on
# Cosmos); a result string with a lone surrogate could not be written by the store.

RUNS: list[str] = []


@durable_activity(name="adv.codec.make", autoretry_for=(Exception,), max_retries=3)  # a retry would run it again
def make(kind: str) -> Any:
    RUNS.append(kind)
    return {"set": {1, 2}, "bytes": b"\xff", "big": 2**60, "surrogate": "a\ud800", "ok": [1, "x"]}[kind]


@durable_activity(name="adv.codec.take")
def take(value: Any) -> str:
    return type(value).__name__


@durable.workflow(name="adv.codec.result_of")
def result_of(kind: str) -> str:
    from celery_durable.errors import ActivityError

    try:
        return repr(make(kind))
    except ActivityError as exc:
        return f"{exc.type_name}|{exc.message}"


@pytest.mark.parametrize("kind", ["set", "bytes", "big", "surrogate"])
def test_an_unfaithful_activity_result_fails_the_activity_once_and_clearly(kind: str, tmp_path: Any) -> None:
    from celery_durable.stores.sqlite.store import SqliteStore

    RUNS.clear()
    # SQLite writes UTF-8: a lone surrogate used to fail the write after the body ran (re-run by recovery)
    env = WorkflowEnvironment(durable, store=SqliteStore(str(tmp_path / "s.db")))
    h = env.start(result_of, kind)
    outcome = env.result(h)
    type_name, _, message = outcome.partition("|")
    assert "PayloadValidationError" in type_name, outcome
    assert "result" in message and "make" in message, outcome
    assert RUNS == [kind], "the activity body must run once (a retry computes the same value)"


def test_a_faithful_activity_result_still_passes() -> None:
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(result_of, "ok")) == "[1, 'x']"


@durable.workflow(name="adv.codec.pass_on")
def pass_on(kind: str) -> str:
    values: dict[str, Any] = {"set": {1}, "bytes": b"x", "nan": [math.nan], "big": -(2**53)}
    try:
        take(values[kind])
    except PayloadValidationError as exc:
        return f"refused: {exc}"
    return "sent"


@pytest.mark.parametrize("kind", ["set", "bytes", "nan", "big"])
def test_unfaithful_activity_arguments_are_refused_in_the_workflow(kind: str) -> None:
    env = WorkflowEnvironment(durable)
    outcome = env.result(env.start(pass_on, kind))
    assert outcome.startswith("refused: ") and "'value'" in outcome, outcome


@pytest.mark.parametrize(
    "bad", [{1, 2}, b"\xff", 2**53, -(2**60), "\udc80", {1: "a"}], ids=["set", "bytes", "big", "-big", "surr", "key"]
)
def test_unfaithful_start_arguments_are_refused_before_anything_is_stored(bad: Any) -> None:
    env = WorkflowEnvironment(durable)
    with pytest.raises(PayloadValidationError, match=r"reading"):
        env.start(echo, bad)
    assert env.store.list_execs().docs == []


@durable.workflow(name="adv.codec.gives")
def gives(kind: str) -> Any:
    return {"set": {1}, "nan": math.nan, "big": 2**60, "tuple": (1, 2)}[kind]


@pytest.mark.parametrize("kind", ["set", "nan", "big"])
def test_an_unfaithful_workflow_result_fails_the_execution(kind: str) -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(gives, kind)
    with pytest.raises(Exception):  # noqa: B017 - the failure itself is checked below
        env.result(h)
    ex = env.engine.read_exec(h.id)
    # ResultPayloadValidationError: a PayloadValidationError no runner retries
    assert ex["status"] == "failed" and ex["error"]["type"].endswith("PayloadValidationError"), ex.get("error")
    assert "result" in ex["error"]["message"]


def test_an_untyped_tuple_result_arrives_as_a_list() -> None:
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(gives, "tuple")) == [1, 2]


@durable.workflow(name="adv.codec.waits", signals={"typed": set[int], "free": Any})
def waits() -> Any:
    from celery_durable import workflow as wf

    return sorted(wf.wait_signal("typed")) + [wf.wait_signal("free")]


def test_signal_values_are_carried_by_their_declared_type_or_refused() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(waits)
    for bad in ({1}, b"x", math.inf, 2**60):
        with pytest.raises(PayloadValidationError):
            env.signal(h, "free", bad)
    with pytest.raises(PayloadValidationError):
        env.signal(h, "typed", {2**60})
    env.signal(h, "typed", {3, 1})  # typed set[int]: carried as a set
    env.signal(h, "free", "done")
    assert env.result(h) == [1, 3, "done"]


@durable.workflow(name="adv.codec.child")
def child(items: Any) -> int:
    return len(items)


@durable.workflow(name="adv.codec.parent")
def parent() -> str:
    try:
        child({"a", "b"})
    except PayloadValidationError as exc:
        return f"refused: {exc}"
    return "started"


def test_unfaithful_child_arguments_are_refused_in_the_parent() -> None:
    env = WorkflowEnvironment(durable)
    outcome = env.result(env.start(parent))
    assert outcome.startswith("refused: ") and "items" in outcome and "set" in outcome, outcome


@durable.effect("adv.codec.note")
def note(payload: Any) -> None:
    pass


@durable.workflow(name="adv.codec.emits")
def emits(kind: str) -> str:
    from celery_durable import workflow as wf

    try:
        wf.emit("adv.codec.note", {"set": {1}, "big": [2**60], "nan": {"x": math.nan}}[kind])
    except PayloadValidationError as exc:
        return f"refused: {exc}"
    return "emitted"


@pytest.mark.parametrize("kind", ["set", "big", "nan"])
def test_unfaithful_effect_payloads_are_refused_in_the_caller(kind: str) -> None:
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(emits, kind)).startswith("refused: ")
    with pytest.raises(PayloadValidationError, match="payload"):
        durable.outbox.enqueue("adv.codec.note", {"set": {1}, "big": [2**60], "nan": {"x": math.nan}}[kind])
