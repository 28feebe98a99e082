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

from celery_durable import Durable, PayloadValidationError
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
def stats(readings: dict) -> float:  # an untyped container
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
