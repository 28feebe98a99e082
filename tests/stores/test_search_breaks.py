"""Adversarial review of search attributes and memo (issue 13 item 5): each test a break found."""

from __future__ import annotations

import time
from typing import Any

from celery_durable.errors import InvalidSearchAttribute
from celery_durable.stores import Doc, Store
from celery_durable.stores.base import ExecFilter
from celery_durable.stores.search import check_memo, check_search
from tests.plugins.postgres import (  # noqa: F401 - fixtures
    _postgres_server,
    postgres_proxied_url,
    postgres_proxy,
    postgres_schema,
    postgres_url,
)
from tests.stores.conftest import backend, store, store_url  # noqa: F401 - fixtures

T0 = float(int(time.time()))


def X(pk: str, created: float, search: dict[str, Any] | None = None, **fields: Any) -> Doc:
    doc: Doc = {"pk": pk, "id": "exec", "workflow": "w", "status": "running", "created_at": created, **fields}
    if search is not None:
        doc["search"] = search
    return doc


def _ids(store: Store, **flt: Any) -> list[str]:  # noqa: F811
    out: list[str] = []
    cursor = None
    for _ in range(50):
        page = store.list_execs(ExecFilter(**flt), limit=2, cursor=cursor)
        out += [d["pk"] for d in page.docs]
        cursor = page.cursor
        if cursor is None:
            return out
    raise AssertionError("the listing never ended")


def test_negative_zero_matches_zero_on_every_backend(store: Store) -> None:  # noqa: F811
    """-0.0 == 0 as numbers (memory, SQLite, PostgreSQL agree); Cosmos indexed it under "-0.0"."""
    store.create(X("a", T0, {"z": -0.0}))
    store.create(X("b", T0 + 1, {"z": 0}))
    assert _ids(store, search={"z": 0}) == ["b", "a"]
    assert _ids(store, search={"z": -0.0}) == ["b", "a"]


def test_awkward_values_round_trip_and_match(store: Store) -> None:  # noqa: F811
    vals = {
        "s": "a/b#c?d=e:f'\"%_\\",
        "u": "\u00fc\u20ac\U0001f600",
        "e": "",
        "big": 2**53 - 1,
        "neg": -(2**53 - 1),
        "tiny": 5e-324,
        "t": "true",
        "three": "3",
    }
    store.create(X("a", T0, vals))
    got = store.read("a", "exec")
    assert got is not None and got["search"] == vals
    for k, v in vals.items():
        assert _ids(store, search={k: v}) == ["a"], k
    assert _ids(store, search={"big": float(2**53 - 1)}) == ["a"]
    assert _ids(store, search={"s": "%"}) == [] and _ids(store, search={"s": "a_b%"}) == []
    assert _ids(store, search={"t": True}) == [] and _ids(store, search={"three": 3}) == []


def test_a_lone_surrogate_is_refused_by_the_rules_or_stored_everywhere(store: Store) -> None:  # noqa: F811
    """check_search passed "\\ud800x" (and check_memo such a memo), then SQLite and PostgreSQL failed
    the write with a UnicodeEncodeError while memory and Cosmos stored it."""
    for attrs, memo in (({"k": "\ud800x"}, None), ({"k": "ok"}, {"note": "\udfffy"})):
        try:
            fields = {"search": check_search(attrs), "memo": check_memo(memo)}
        except InvalidSearchAttribute:
            continue
        pk = f"p{len(str(memo))}"
        store.create(X(pk, T0, **fields))
        got = store.read(pk, "exec")
        assert got is not None and got["search"] == attrs and got["memo"] == memo


def test_numbers_keep_their_value_through_the_store(store: Store) -> None:  # noqa: F811
    """Held: numbers come back as the same JSON number (Cosmos gives 3.0 back as 3: one number type)."""
    from celery_durable.codecs import same_json

    vals = {"i": 3, "f": 3.0, "big": 2**53 - 1, "fbig": 1e300, "neg0": -0.0, "b": True, "half": 0.5}
    store.create(X("a", T0, vals, memo={"i": 1, "f": 1.0}))
    got = store.read("a", "exec")
    assert got is not None and same_json(got["search"], vals) and same_json(got["memo"], {"i": 1, "f": 1.0})
    assert isinstance(got["search"]["b"], bool) and isinstance(got["search"]["i"], int)
    (doc,) = store.list_execs(ExecFilter(search={"i": 3})).docs
    assert same_json(doc["search"], vals)


def test_a_value_a_store_would_change_is_refused_or_kept(store: Store) -> None:  # noqa: F811
    """check_search passed the float 2.0**60 and check_memo the int 2**60 + 1 and the int key 1:
    Cosmos gave the numbers back as other numbers and every store gave the key back as "1"."""
    from celery_durable.codecs import same_json

    cases: list[tuple[dict[str, Any], Any]] = [
        ({"k": 2.0**60}, None),
        ({"k": "ok"}, {"n": 2**60 + 1}),
        ({"k": "ok"}, {1: "one"}),
        ({"k": "ok"}, [{"f": 1e20}]),
    ]
    for i, (attrs, memo) in enumerate(cases):
        try:
            fields = {"search": check_search(attrs), "memo": check_memo(memo)}
        except InvalidSearchAttribute:
            continue
        store.create(X(f"v{i}", T0, **fields))
        got = store.read(f"v{i}", "exec")
        assert got is not None
        assert same_json(got["search"], attrs) and same_json(got["memo"], memo), (i, got["search"], got["memo"])


def test_a_repeated_search_attribute_is_refused_not_overwritten() -> None:
    """``--search a=1 --search a=2`` (CLI, UI) listed the executions with a=2: the first was dropped."""
    import pytest

    from celery_durable.stores.search import parse_pairs

    with pytest.raises(InvalidSearchAttribute):
        parse_pairs(["a=1", "a=2"])
    with pytest.raises(InvalidSearchAttribute):
        parse_pairs(["a=1", " a=1"])
    assert parse_pairs(["a=1", "b=x"]) == {"a": 1, "b": "x"}
