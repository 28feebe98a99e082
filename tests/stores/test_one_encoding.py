"""A document is JSON-encoded once on its way to the store (issue 28): the offload wrapper
measures it and the backend writes that same text (``EncodedDoc``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from celery_durable.stores import store_from_url
from celery_durable.stores.base import EncodedDoc, Op, encode_doc


def _counting(monkeypatch: pytest.MonkeyPatch, doc_id: str) -> list[int]:
    calls: list[int] = []
    real = json.dumps

    def dumps(obj: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(obj, dict) and obj.get("id") == doc_id:
            calls.append(1)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", dumps)
    return calls


def test_a_sqlite_write_encodes_each_document_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_from_url(f"sqlite:///{tmp_path / 'd.db'}")
    try:
        calls = _counting(monkeypatch, "a")
        store.create({"pk": "p", "id": "a", "type": "step", "value": "é" * 10})
        assert len(calls) == 1
        calls.clear()
        doc = store.read("p", "a")
        assert doc is not None
        store.batch("p", [Op.replace({"pk": "p", "id": "a", "type": "step", "value": 2}, doc["_etag"])])
        assert len(calls) == 1
    finally:
        store.close()


def test_encode_doc_reuses_the_text_and_still_checks_the_limit() -> None:
    doc = {"pk": "p", "id": "a", "v": "x" * 100}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    assert encode_doc(EncodedDoc(doc, text)) == encode_doc(doc) == text
    from celery_durable.errors import DocumentTooLarge

    with pytest.raises(DocumentTooLarge):
        encode_doc(EncodedDoc(doc, text), limit=50)
