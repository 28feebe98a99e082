"""The recovery scan collects orphan chunk documents (stores/offload/chunk_gc.py) and keeps referenced ones.

A process that dies after writing a large document's chunks but before its main document (the
commit point) leaves chunks nobody references; the engine's recovery scan (beat) deletes them
once they are older than the grace, on the engine's clock, and never the chunks of a document
that names them.
"""

from __future__ import annotations

from celery_durable.stores.offload.store import CHUNK_PREFIX, Offloading
from tests.engine.inprocess import FakeClock, InProcess

MB = 1024 * 1024
#: an hour and a bit: past the grace of every chunk written before
LATER = 3600 + 60


def _chunks(env: InProcess, pk: str) -> set[str]:
    # the store the engine was given (its own may be wrapped: a process with an OpenTelemetry
    # tracer provider traces it, stores/traced.py, and test_tracing sets one for the process)
    assert isinstance(env.store, Offloading)
    return {d["id"] for d in env.store.backend.query_partition(pk).docs if d["id"].startswith(CHUNK_PREFIX)}


def test_recovery_deletes_chunks_of_a_write_that_died_and_keeps_the_result() -> None:
    env = InProcess()
    assert isinstance(env.clock, FakeClock)

    @env.activity
    def blob(n: int) -> str:
        return "x" * n

    def flow(n: int) -> str:
        return str(blob(n)) + "!"

    eid = env.start(env.workflow(flow), 3 * MB)
    assert env.status(eid) == "completed"
    ex = env.ex(eid)
    live = _chunks(env, eid)
    assert live  # the activity's result and the workflow's are offloaded
    # a writer dies between the chunks of a big document and its main document
    store = env.store
    assert isinstance(store, Offloading)
    _, pending, _ = store._ofl_split({"pk": eid, "id": "exec", "status": "completed", "result": "y" * 3 * MB})
    store._ofl_put_chunks(eid, pending)
    orphans = {c["id"] for c in pending}
    assert _chunks(env, eid) == live | orphans
    env.engine.recovery.scan()
    assert _chunks(env, eid) == live | orphans  # within the grace: maybe a write on its way
    env.clock.advance(LATER)
    report = env.engine.recovery.scan()
    assert _chunks(env, eid) == live
    assert report.errors == 0 and report.chunks_collected == 1
    assert env.ex(eid) == ex and env.status(eid) == "completed"
    env.clock.advance(LATER)
    assert env.engine.recovery.scan().chunks_collected == 0
    assert _chunks(env, eid) == live and env.ex(eid) == ex
