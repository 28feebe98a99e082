"""Every engine document a test writes has only the fields its type declares (engine/documents/records.py).

The stores' ``encode_doc`` (each write goes through it) is wrapped for the whole session; after
each test, a document it wrote with a field its ``TypedDict`` does not declare fails that test,
naming the document and the field. So the types stay true to what the engine writes: a new field
must be declared (with its type) where the next engineer reads the documents. A test that writes
foreign documents on purpose says so with ``@pytest.mark.foreign_documents``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from celery_durable.engine.documents.records import record_type, undeclared

#: the modules whose writes go through ``encode_doc`` (each imported it by name)
STORE_MODULES = (
    "celery_durable.stores.base",
    "celery_durable.stores.memory",
    "celery_durable.stores.sqlite.writes",
    "celery_durable.stores.postgres.store",
    "celery_durable.stores.cosmos.store",
)

_found: list[str] = []


def _recording(encode: Callable[..., str]) -> Callable[..., str]:
    def encode_doc(doc: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(doc, dict) and (extra := undeclared(doc)):
            _found.append(f"{doc.get('pk')!r}/{doc.get('id')!r} ({record_type(doc)}): {sorted(extra)}")
        return encode(doc, *args, **kwargs)

    encode_doc.__wrapped__ = encode  # type: ignore[attr-defined]
    return encode_doc


def pytest_configure(config: pytest.Config) -> None:
    for name in STORE_MODULES:
        module = importlib.import_module(name)
        if not hasattr(module.encode_doc, "__wrapped__"):
            module.encode_doc = _recording(module.encode_doc)


@pytest.fixture(autouse=True)
def _documents_as_declared(request: pytest.FixtureRequest) -> Iterator[None]:
    _found.clear()
    yield
    found, _found[:] = list(_found), []
    if found and request.node.get_closest_marker("foreign_documents") is None:
        listed = "\n  ".join(sorted(set(found))[:20])
        pytest.fail(f"documents written with fields engine/documents/records.py does not declare:\n  {listed}")
