"""Adversarial tests of value fidelity (celery_durable/codecs.py and the stores underneath).

Promise (README "Concepts" → Payloads; docs/architecture.md §4 "Values"): "A value is carried
exactly or refused ... never silently changed"; "a payload valid on SQLite must not break on
Cosmos".
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable.codecs import ValueCodec
from celery_durable.errors import PayloadValidationError
from celery_durable.stores import Store


def _round_trip(store: Store, value: Any) -> Any:
    codec = ValueCodec(Any)
    data = codec.encode(value)  # accepted: it must come back equal
    store.create({"pk": "p", "id": "r:000001", "value": data})
    doc = store.read("p", "r:000001")
    assert doc is not None
    return codec.decode(doc["value"])


@pytest.mark.parametrize("value", [2.0**60, 1e16, -(2.0**53), 2.0**53 - 1, 1e15 + 0.5, 0.1])
def test_an_accepted_float_comes_back_equal_on_every_store(adv_store: Store, value: Any) -> None:
    """Was broken on Cosmos ("carried exactly or refused"): the untyped float 2.0**60 was
    accepted, and Cosmos gave back the int 1152921504606847000 (JavaScript's shortest digits
    read as an integer by Python), which is not == 2**60. Whole floats beyond 2^53-1 are now
    refused; every float accepted comes back equal."""
    try:
        back = _round_trip(adv_store, value)
    except PayloadValidationError:
        assert value.is_integer() and abs(value) > 2**53 - 1  # refused only where a store may change it
        return
    assert back == value


def test_a_float_read_back_can_be_passed_on(adv_store: Store) -> None:
    """Was broken ("a payload valid on SQLite must not break on Cosmos"): the float 1e16,
    accepted as an activity result, came back from Cosmos as the int 10**16 (beyond 2^53-1), so
    passing it on unchanged to the next activity was refused. It is now refused where it enters,
    and what is accepted can be passed on."""
    with pytest.raises(PayloadValidationError, match="whole number beyond"):
        _round_trip(adv_store, {"total": 1e16})
    back = _round_trip(adv_store, {"total": 1e15})
    ValueCodec(Any).encode(back)  # the workflow hands its input straight on


def test_a_float_hint_never_rounds_an_int_silently() -> None:
    """Breaks "never silently changed": an int beyond 2^53 passed where the hint says float is
    accepted and arrives as a different number (2**53 + 1 → 9007199254740992.0), where an int
    hint or an untyped place refuses it."""
    value = 2**53 + 1
    try:
        data = ValueCodec(float).encode(value)
    except PayloadValidationError:
        return  # refused: the promise holds
    assert ValueCodec(float).decode(data) == value
