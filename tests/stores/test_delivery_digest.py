"""The delivery proof's input digest (engine/activities/delivery.py) on every backend: the arguments a
message carries (the codec's JSON, as sent) and the marker's ``input`` as the store gives it back
digest alike, so no genuine delivery is taken for a stale one (a jsonb, a Cosmos document or
SQLite's JSON text may reorder keys or re-type numbers)."""

from __future__ import annotations

import json
from typing import Any

from celery_durable.engine.activities.delivery import Delivery, refusal, step_token
from celery_durable.stores.base import Store

ARGS: list[Any] = [
    0,
    -1,
    2**53 - 1,
    2**60 + 1,  # beyond a double: Cosmos gives back the nearest one
    2.0,  # Cosmos gives back 2
    1.5,
    1e-7,
    12345.678,
    -0.25,
    True,
    None,
    "",
    "é ü 中文 \u2028 \\ \" '",
    {"b": 1, "a": [1, 2, {"z": None, "y": 1.0}], "": "empty key", "10": 10, "9": 9},
    [[], {}, [[]]],
]
KWARGS: dict[str, Any] = {"zeta": 1, "alpha": {"nested": [1.25, "x"]}}


def test_a_message_digests_like_its_stored_marker(store: Store) -> None:
    token = step_token("dig", 0, 1, 0)
    marker = {"pk": "dig", "id": "s:000001", "type": "step", "seq": 1, "kind": "activity", "name": "a"}
    marker |= {"token": token, "input": {"args": ARGS, "kwargs": KWARGS}}
    store.create(json.loads(json.dumps(marker)))
    back = store.read("dig", "s:000001")
    assert back is not None
    sent = json.loads(json.dumps({"args": ARGS, "kwargs": KWARGS}))  # what the broker carries
    assert refusal(back, Delivery.of(token, "a", sent["args"], sent["kwargs"])) is None
    assert refusal(back, Delivery.of(token, "a", [*sent["args"], 1], sent["kwargs"])) is not None
