"""Values JSON cannot carry faithfully are refused in the caller, never silently changed (issue 12).

The rule (``celery_durable/codecs.py``): what the receiving side decodes equals what the caller
passed, under the declared type. A type hint carries what it names (``set[int]``, ``bytes``,
``dict[int, str]``, ``datetime``, models); an untyped (``Any``) position carries JSON's own values
only (``dict`` with ``str`` keys, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``; a
``tuple`` arrives as a ``list``). ``nan``/``inf``, integers beyond ±(2^53−1) and strings with
lone surrogates are refused everywhere. A refusal is a :class:`PayloadValidationError` naming the
path to the bad value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from celery_durable.codecs import CallCodec, ValueCodec
from celery_durable.errors import NonRetryableError, PayloadValidationError

MAX = 2**53 - 1


def store_round_trip(codec: ValueCodec, value: Any) -> Any:
    """What a store gives back: strict JSON (no nan), UTF-8 bytes, ints exact as doubles (Cosmos)."""
    data = codec.encode(value)
    text = json.dumps(data, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")  # every store writes UTF-8: a lone surrogate would raise here

    def doubles(x: Any) -> Any:  # Cosmos keeps numbers as doubles
        if isinstance(x, int) and not isinstance(x, bool):
            assert float(x) == x and abs(x) <= MAX, f"{x} is not exact as a double"
        if isinstance(x, dict):
            return {k: doubles(v) for k, v in x.items()}
        if isinstance(x, list):
            return [doubles(v) for v in x]
        return x

    return codec.decode(doubles(json.loads(text)))


def refused(codec: ValueCodec, value: Any, *fragments: str) -> str:
    with pytest.raises(PayloadValidationError) as info:
        codec.encode(value)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return str(info.value)


# --- untyped positions: JSON's own values only --------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({1, 2}, "set"),
        (frozenset({1}), "frozenset"),
        (b"ab", "bytes"),
        (b"\xff\xfe", "bytes"),  # was a raw UnicodeDecodeError
        (bytearray(b"ab"), "bytearray"),
        ({1: "a"}, "key 1"),
        ({(1, 2): "a"}, "key (1, 2)"),
        (date(2024, 1, 1), "date"),
        (Decimal("1.5"), "Decimal"),
        (1 + 2j, "complex"),
    ],
    ids=[
        "set",
        "frozenset",
        "bytes",
        "bytes-not-utf8",
        "bytearray",
        "int-key",
        "tuple-key",
        "date",
        "decimal",
        "complex",
    ],
)
def test_untyped_value_json_would_change_is_refused(value: Any, fragment: str) -> None:
    refused(ValueCodec(Any), value, fragment)
    refused(ValueCodec(Any), {"deep": [0, value]}, fragment, "value['deep'][1]")


def test_the_path_to_the_bad_value_is_in_the_message() -> None:
    def place(order: Any, *, note: Any = None) -> None: ...

    codec = CallCodec(place)
    with pytest.raises(PayloadValidationError, match=r"order\['items'\]\[2\]"):
        codec.encode_args(({"items": [1.0, 2.0, math.nan]},), {})
    with pytest.raises(PayloadValidationError, match=r"note\[0\]"):
        codec.encode_args(({},), {"note": [{1, 2}]})


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("hint", [Any, float, list[float], dict[str, float]], ids=["Any", "float", "list", "dict"])
def test_nan_and_infinity_are_refused_typed_or_not(bad: float, hint: Any) -> None:
    value = bad if hint in (Any, float) else ([1.0, bad] if hint == list[float] else {"x": bad})
    refused(ValueCodec(hint), value, "nan and infinity")


class Reading(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="null")  # a model's own config: nan would become null
    value: float | None


def test_nan_in_a_model_with_its_own_config_is_refused() -> None:
    refused(ValueCodec(Reading), Reading(value=math.nan), "nan and infinity")
    refused(ValueCodec(Any), {"r": Reading(value=1.0)}, "Reading")  # untyped model: arrives as a dict


@pytest.mark.parametrize("hint", [Any, int, list[int]], ids=["Any", "int", "list[int]"])
def test_integers_beyond_2_pow_53_are_refused_on_every_store(hint: Any) -> None:
    wrap = (lambda v: [v]) if hint == list[int] else (lambda v: v)
    for ok in (MAX, -MAX, 0, True):
        assert store_round_trip(ValueCodec(hint), wrap(ok)) == wrap(ok)
    for bad in (MAX + 1, -MAX - 1, 2**64):
        refused(ValueCodec(hint), wrap(bad), "2^53", str(bad))


def test_big_integers_travel_as_decimal_or_str() -> None:
    assert store_round_trip(ValueCodec(Decimal), Decimal(2**64)) == Decimal(2**64)
    assert store_round_trip(ValueCodec(str), str(2**64)) == str(2**64)


@pytest.mark.parametrize("hint", [Any, str, dict[str, int]], ids=["Any", "str", "dict"])
def test_lone_surrogates_are_refused(hint: Any) -> None:
    value = {"a\ud800": 1} if hint == dict[str, int] else "x\udcff"
    refused(ValueCodec(hint), value, "surrogate")


def test_tuples_arrive_as_lists_untyped_and_as_tuples_typed() -> None:
    assert store_round_trip(ValueCodec(Any), (1, ("a", None))) == [1, ["a", None]]
    assert store_round_trip(ValueCodec(tuple[int, tuple[str, None]]), (1, ("a", None))) == (1, ("a", None))


# --- typed positions carry what the hint names ------------------------------------------------------


@pytest.mark.parametrize(
    ("hint", "value"),
    [
        (set[int], {3, 1, 2}),
        (frozenset[str], frozenset({"a"})),
        (bytes, b"\xff\x00binary"),
        (list[bytes], [b"\x80", b""]),
        (dict[int, str], {1: "a", -2: "b"}),
        (datetime, datetime(2024, 1, 1, 12, tzinfo=UTC)),
        (Decimal, Decimal("1.50")),
        (dict[str, Any], {"a": [1, "x", None, {"b": 2.5}]}),
    ],
    ids=str,
)
def test_a_typed_value_round_trips_exactly(hint: Any, value: Any) -> None:
    back = store_round_trip(ValueCodec(hint), value)
    assert back == value and type(back) is type(value)


def test_a_typed_value_pydantic_cannot_read_back_is_refused() -> None:
    # pydantic writes a tuple key as "1,2" but cannot read it back: refused, not garbled
    refused(ValueCodec(dict[tuple[int, int], str]), {(1, 2): "a"}, "does not decode back")


def test_a_str_passed_for_bytes_is_its_utf8_not_base64_decoded() -> None:
    assert store_round_trip(ValueCodec(bytes), "hello") == b"hello"


class Box(BaseModel):
    tags: set[str]
    extra: Any = None


@dataclass
class Blob:
    data: bytes


def test_untyped_parts_of_typed_values_are_checked_too() -> None:
    assert store_round_trip(ValueCodec(Box), Box(tags={"a"}, extra={"k": [1]})) == Box(tags={"a"}, extra={"k": [1]})
    refused(ValueCodec(Box), Box(tags={"a"}, extra={1, 2}), "value.extra", "set")
    refused(ValueCodec(dict[str, Any]), {"a": b"x"}, "value['a']", "bytes")
    refused(ValueCodec(list[Any]), [1, (2, {3})], "value[1][1]")


def test_non_utf8_bytes_in_a_dataclass_field_are_refused_not_a_unicode_error() -> None:
    assert store_round_trip(ValueCodec(Blob), Blob(b"text")) == Blob(b"text")
    refused(ValueCodec(Blob), Blob(b"\xff"), "value.data")


def test_a_value_containing_itself_is_refused_clearly() -> None:
    loop: list[Any] = []
    loop.append(loop)
    refused(ValueCodec(list[Any]), loop, "not JSON-serialisable")
    refused(ValueCodec(Any), loop, "not JSON-serialisable")


def test_an_unfaithful_activity_result_fails_at_once_without_retries() -> None:
    def activity() -> Any: ...

    with pytest.raises(PayloadValidationError) as info:
        CallCodec(activity).encode_result({1, 2})
    # a retry would compute the same value again: the runners skip retries for it
    assert isinstance(info.value, NonRetryableError)
    assert "result" in str(info.value)


# --- property: a value is carried exactly, or refused -------------------------------------------------

_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-MAX, MAX)
    | st.floats()
    | st.text(alphabet=st.characters(), max_size=4)  # surrogates included
    | st.binary(max_size=4)
    | st.dates()
    | st.decimals(allow_nan=False)
)
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.frozensets(st.integers() | st.text(max_size=2), max_size=3)
        | st.sets(st.integers(-MAX, MAX), max_size=3)
        | st.dictionaries(st.text(alphabet=st.characters(), max_size=3) | st.integers(), inner, max_size=3)
    ),
    max_leaves=8,
)


def _same(a: Any, b: Any) -> bool:
    """Equal with the same types (a tuple arrives as a list where untyped)."""
    if type(a) is tuple and type(b) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values, st.sampled_from([Any, dict[str, Any] | list[Any] | Any, list[Any] | Any]))
def test_a_value_is_carried_exactly_or_refused_never_changed(value: Any, hint: Any) -> None:
    codec = ValueCodec(hint)
    try:
        back = store_round_trip(codec, value)
    except PayloadValidationError:
        return
    assert _same(value, back), f"{value!r} came back as {back!r}"


_typed = st.one_of(
    st.tuples(st.just(set[int]), st.sets(st.integers(), max_size=3)),
    st.tuples(st.just(bytes), st.binary(max_size=6)),
    st.tuples(st.just(dict[int, str]), st.dictionaries(st.integers(), st.text(alphabet=st.characters()), max_size=3)),
    st.tuples(st.just(list[float]), st.lists(st.floats(), max_size=3)),
    st.tuples(st.just(Box), st.builds(Box, tags=st.sets(st.text(max_size=2)), extra=_values)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_typed)
def test_a_typed_value_is_carried_exactly_or_refused(case: tuple[Any, Any]) -> None:
    hint, value = case
    codec = ValueCodec(hint)
    try:
        back = store_round_trip(codec, value)
    except PayloadValidationError:
        return
    if hint is Box:
        assert back.tags == value.tags and _same(value.extra, back.extra), f"{value!r} came back as {back!r}"
    else:
        assert back == value and type(back) is type(value), f"{value!r} came back as {back!r}"
