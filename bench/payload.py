"""Large payloads (issue 12): the round trip of a 10 MB activity result, offloaded into chunk
documents (``celery_durable/stores/offload/store.py``), on SQLite and on the Cosmos test server.

Two figures per backend, the median of ``--runs`` runs:

* *store*: ``create`` then ``read`` of one 10 MB document (chunks written, reassembled, digest checked);
* *workflow*: ``start`` to ``result`` of a workflow whose one activity returns 10 MB, in-process
  (``WorkflowEnvironment`` on that store): the result is recorded, replayed, and becomes the
  workflow's result (the exec document, offloaded too), then read by the handle.

Target: the workflow round trip on SQLite under 5 s. ``python bench/payload.py [--mb 10] [--runs 3]
[--no-cosmos]``; the Cosmos test server needs Node.js (``celery_durable/testing/cosmos_server.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery import Celery  # noqa: E402

from bench._common import machine, print_table, verdict  # noqa: E402
from celery_durable import Durable, durable_activity  # noqa: E402
from celery_durable.stores import Store, store_from_url  # noqa: E402
from celery_durable.testing.env import WorkflowEnvironment  # noqa: E402

MB = 1024 * 1024
TARGET_S = 5.0


@durable_activity(name="bench.payload.blob")
def blob(n: int) -> str:
    return "x" * n


def _workflow_round_trip(store: Store, size: int) -> float:
    durable = Durable(Celery("bench-payload", set_as_current=False), store="memory://")

    @durable.workflow(name="bench.payload.flow")
    def flow(n: int) -> str:
        return blob(n)

    env = WorkflowEnvironment(durable, store=store)
    t0 = time.perf_counter()
    handle = env.start(flow, size)
    value = env.result(handle)
    elapsed = time.perf_counter() - t0
    assert len(value) == size
    return elapsed


def _store_round_trip(store: Store, size: int) -> float:
    pk = uuid.uuid4().hex
    doc: dict[str, Any] = {"pk": pk, "id": "big", "blob": "y" * size}
    t0 = time.perf_counter()
    store.create(doc)
    got = store.read(pk, "big")
    elapsed = time.perf_counter() - t0
    assert got is not None and len(got["blob"]) == size
    return elapsed


def _measure(name: str, url: str, size: int, runs: int) -> list[object]:
    store = store_from_url(url)
    try:
        st = statistics.median(_store_round_trip(store, size) for _ in range(runs))
        wf = statistics.median(_workflow_round_trip(store, size) for _ in range(runs))
    finally:
        store.close()
    return [name, f"{size / MB:g} MB", f"{st:.2f} s", f"{wf:.2f} s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-cosmos", action="store_true")
    args = parser.parse_args()
    size = int(args.mb * MB)
    print(machine())
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-payload-") as tmp:
        rows.append(_measure("sqlite", f"sqlite:///{tmp}/bench.db", size, args.runs))
    if not args.no_cosmos:
        from celery_durable.testing.cosmos_server import CosmosTestServer

        with CosmosTestServer() as server:
            rows.append(_measure("cosmos (test server)", server.url_for("bench", "payload"), size, args.runs))
    print_table(["backend", "payload", "store create+read", "workflow start→result"], rows, title="Large payloads")
    sqlite_wf = float(str(rows[0][3]).split()[0])
    print(verdict(f"sqlite {args.mb:g} MB activity result round trip (s)", sqlite_wf, TARGET_S, higher_is_better=False))


if __name__ == "__main__":
    main()
