"""Breaker: PostgreSQL batches prepared again; mixed failing / succeeding batches on one connection."""

from __future__ import annotations

import random

import pytest

from celery_durable.errors import ConflictError
from celery_durable.stores import store_from_url
from celery_durable.stores.base import Op


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_batches_of_many_shapes_on_one_connection(postgres_url: str, seed: int) -> None:
    rng = random.Random(seed)
    sep = "&" if "?" in postgres_url else "?"
    store = store_from_url(postgres_url + f"{sep}pool_max=1")
    try:
        model: dict[str, tuple[str, int]] = {}  # id -> (etag, n)
        for round_ in range(250):
            size = rng.choice([1, 2, 3, rng.randint(1, 100)])
            ids = rng.sample(range(150), size)
            ops, expect_conflict, writes = [], False, {}
            for k in ids:
                doc_id = f"d{k}"
                n = round_ * 1000 + k
                doc = {"pk": "p", "id": doc_id, "n": n}
                if rng.random() < 0.3:
                    doc.update(due_kind="activity", due_at=float(n))
                have = model.get(doc_id)
                r = rng.random()
                if have is None:
                    if r < 0.05:
                        ops.append(Op.replace(doc, "1"))
                        expect_conflict = True
                    else:
                        ops.append(Op.create(doc))
                        writes[doc_id] = n
                elif r < 0.4:
                    stale = r < 0.06
                    ops.append(Op.replace(doc, "1" if stale else have[0]))
                    expect_conflict |= stale
                    writes[doc_id] = n
                elif r < 0.5:
                    ops.append(Op.create(doc))  # exists: unique violation
                    expect_conflict = True
                elif r < 0.7:
                    ops.append(Op.upsert(doc))
                    writes[doc_id] = n
                elif r < 0.8:
                    ops.append(Op.delete(doc_id, have[0]))
                    writes[doc_id] = -1
                else:
                    ops.append(Op.replace(doc, None))
                    writes[doc_id] = n
            if expect_conflict:
                with pytest.raises(ConflictError):
                    store.batch("p", ops)
                continue
            etags = store.batch("p", ops)
            for op, etag in zip(ops, etags, strict=True):
                if writes[op.doc_id] == -1:
                    model.pop(op.doc_id, None)
                else:
                    assert etag is not None
                    model[op.doc_id] = (etag, writes[op.doc_id])
        for doc_id, (etag, n) in model.items():
            doc = store.read("p", doc_id)
            assert doc is not None and doc["n"] == n and doc["_etag"] == etag
    finally:
        store.close()
