"""Document ids, types, statuses and due kinds of an execution: the one place that spells them.

Every module that reads or writes execution documents (the engine, the read model, the CLI)
uses these names instead of string literals, so an id format exists once. Values are
``StrEnum`` members: they compare equal to, and serialize as, the plain strings stored in
documents, so stored data does not change. See ``docs/architecture.md`` for the documents.

Partition = execution id. In it:

* ``exec`` — the execution: workflow, payload, status, result/error, cancel flag, lease, and the
  ``custom_status`` its code last set (``wf.set_status``), written by a drive when it changed;
  ``search`` (indexed attributes: start, ``wf.upsert_search``; ``search_run``: what the run started
  with, for a reset) and ``memo`` (engine/documents/search.py).
* ``s:000001`` — the *marker* of step 1 of run 0 (``s2:000001`` in run 2): what the step is.
* ``r:000001`` — the step's *outcome*, create-only (first writer wins).
* ``w:000004`` — the decision of the signal wait at step 4 (``w2:000004`` in run 2): the value it
  consumed or its timeout, create-only. Waits recorded before decisions were per step have theirs
  per run and name, ``sig:<name>`` (``sig2:<name>``); their markers carry no ``decision``.
* ``sgv:000003`` — the 3rd signal value sent to the execution (any run), recorded atomically
  with an exec bump; ``sgx:000003`` — its settlement (consumed, rejected or ignored).
* ``sgk:<digest>`` — the dedupe key of a value sent by another workflow (``wf.signal_external``),
  created in the same batch as its ``sgv:``: a retried send finds it and records nothing.
* ``op:000001`` — an operator's action on the execution (``reset``): who, when, from which step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

__all__ = [
    "EXEC_ID",
    "NOT_STARTED",
    "DocType",
    "Status",
    "DueKind",
    "StepKind",
    "TERMINAL",
    "marker_id",
    "result_id",
    "signal_id",
    "wait_decision_id",
    "signal_outcome_id",
    "parse_step_id",
    "run_prefixes",
    "input_id",
    "activity_task_id",
    "task_id_of",
    "is_step_id",
    "SIGNAL_VALUE_PREFIX",
    "SIGNAL_MARK_PREFIX",
    "signal_value_id",
    "signal_mark_id",
    "child_execution_id",
    "SIGNAL_KEY_PREFIX",
    "signal_key_id",
    "external_signal_id",
    "rerun_suffix",
    "default_effect_id",
    "OPERATION_PREFIX",
    "operation_id",
    "CANCELLED_BY_PARENT",
]

SIGNAL_VALUE_PREFIX = "sgv:"
SIGNAL_MARK_PREFIX = "sgx:"
SIGNAL_KEY_PREFIX = "sgk:"
OPERATION_PREFIX = "op:"

#: id of the execution document in its partition
EXEC_ID = "exec"
#: the exec field holding an operator operation's unfinished rest (engine/admin/pending_ops.py)
PENDING_OP: Final = "pending_op"
#: the exec field of a child whose cancel came from its parent's (not from an operator): a resume
#: or reset of the parent that withdraws its cancel withdraws the child's too (engine/admin/operator.py)
CANCELLED_BY_PARENT = "cancelled_by_parent"


class DocType(StrEnum):
    """The ``type`` field of a document in an execution's partition."""

    EXEC = "exec"
    STEP = "step"
    RESULT = "result"
    #: a signal wait's decision (the value consumed, or its timeout), per wait step (``w:…``)
    SIGNAL = "signal"
    #: a signal value as sent (``sgv:…``), not tied to a run
    SIGNAL_VALUE = "signal_value"
    #: settlements of a sent value that no wait consumed (``sgx:…``)
    SIGNAL_REJECTED = "signal_rejected"
    SIGNAL_IGNORED = "signal_ignored"
    #: the dedupe key of a value sent by a workflow (``sgk:…``)
    SIGNAL_KEY = "signal_key"
    #: an operator's recorded action (``op:…``): a reset
    OPERATION = "operation"
    #: the rest of an operation's archive of forgotten steps (``op:<n>.<k>``: engine/admin/oplog.py)
    OPERATION_PART = "operation_part"
    #: a run's input when too large to ride in the exec (``in:payload``: model.split_payload)
    INPUT = "input"
    #: an execution's deadline or delayed start (``clock:deadline``, ``clock:start``:
    #: engine/starts/deadlines.py), due for the timer scan
    CLOCK = "clock"
    #: a limit's slots and queue for one key (``lim:…/slots``: engine/limits/)
    LIMIT = "limit"
    #: a managed schedule, at its next tick (engine/schedules/)
    SCHEDULE = "schedule"


class Status(StrEnum):
    """The ``status`` of an execution."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: its deadline (``options(timeout=)``) passed: raised at its suspension point, compensated
    TIMED_OUT = "timed_out"
    #: created by a start with ``options(start_delay=)``; its first drive is when the delay's clock
    #: fires (engine/starts/deadlines.py). A stored status, not a display derived from a start
    #: time: listings, counts and ``--status`` filters are store queries on the stored status
    #: (SQLite/PostgreSQL columns, Cosmos indexes), which a derived value would escape; a
    #: scheduled execution is not terminal, and the driver drives none (``Driver._round``).
    SCHEDULED = "scheduled"
    #: created by a start under a limit (``@durable.workflow(limit=)``, ``options(limit=)``) that
    #: waits for a slot of its key: first driven when it gets one (engine/limits/workflows.py).
    #: Stored, not terminal, never driven, as ``scheduled``
    QUEUED = "queued"


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.TIMED_OUT})
#: created, none of its code run yet: waiting for its start clock or a slot of its limit
NOT_STARTED = frozenset({Status.SCHEDULED, Status.QUEUED})


class DueKind(StrEnum):
    """``due_kind`` of a document some scan must look at when ``due_at`` passes (stores.base)."""

    #: an execution that needs a drive (lost message, lapsed exec lease, unknown workflow)
    EXEC = "exec"
    #: an activity step whose message was not picked up or whose attempt lease lapsed
    ACTIVITY = "activity"
    #: a timer, or a signal wait's timeout
    CLOCK = "clock"
    #: a child workflow step not yet seen started or finished
    CHILD = "child"
    #: a limit document while steps wait on it: a holder's expiry or the rate's next opening
    LIMIT = "limit"
    #: a managed schedule at its next tick, or rechecking a tick it keeps (engine/schedules/)
    SCHEDULE = "schedule"


class StepKind(StrEnum):
    """The ``kind`` of a step marker (checked on replay, with its name)."""

    ACTIVITY = "activity"
    SLEEP = "sleep"
    SIGNAL = "signal"
    CHILD = "child"
    EMIT = "emit"
    NOW = "now"
    UUID = "uuid"
    SEED = "seed"
    #: the recorded answer of ``DurableFuture.done()``
    DONE = "done"
    #: ``wf.patched(change_id)`` answered True at this point (name: the change id). Taken only by
    #: executions that reached the point on code with the patch: histories recorded before it have
    #: no marker here, and their step numbers never shift (``engine/replay/versioning.py``)
    PATCH = "patch"
    #: ``wf.signal_external``: a signal value sent to another execution (name: the signal)
    SIGNAL_SEND = "signal_send"
    #: ``wf.publish(topic, value)`` and ``wf.set_event(key, value)``: a value recorded for readers
    #: outside (``handle.stream``, ``handle.get_event``: engine/replay/events.py); name: the topic, key
    PUBLISH = "publish"
    EVENT = "event"
    #: an accepted update applied here (name: the update; ``request``: its ``upd:<n>``): a replay
    #: calls its handler again at the same point (engine/replay/updates.py)
    UPDATE = "update"


def _run(run: int) -> str:
    return str(run) if run else ""


def marker_id(seq: int, run: int = 0) -> str:
    """``s:000007`` (run 0), ``s2:000007`` (run 2)."""
    return f"s{_run(run)}:{seq:06d}"


def result_id(seq: int, run: int = 0) -> str:
    """``r:000007`` (run 0), ``r2:000007`` (run 2)."""
    return f"r{_run(run)}:{seq:06d}"


def signal_id(name: str, run: int = 0) -> str:
    """``sig:<name>``: a wait's decision as recorded before decisions were per step (read only)."""
    return f"sig{_run(run)}:{name}"


def wait_decision_id(seq: int, run: int = 0) -> str:
    """``w:000007``: the decision of the signal wait at step 7 (``w2:000007`` in run 2)."""
    return f"w{_run(run)}:{seq:06d}"


def signal_outcome_id(marker: Mapping[str, Any], run: int = 0) -> str:
    """Where the outcome of a signal wait lives: the id its marker names (``decision``), or for a
    marker recorded before waits were decided per step, the old per-name ``sig<run>:<name>``."""
    decision = marker.get("decision")
    return decision if isinstance(decision, str) else signal_id(str(marker["name"]), run)


def signal_value_id(n: int) -> str:
    """``sgv:000003``: the n-th signal value sent to an execution."""
    return f"{SIGNAL_VALUE_PREFIX}{n:06d}"


def signal_mark_id(n: int) -> str:
    """``sgx:000003``: how the n-th signal value was settled."""
    return f"{SIGNAL_MARK_PREFIX}{n:06d}"


def child_execution_id(parent_id: str, run: int, seq: int, reruns: int = 0) -> str:
    """The derived id of the child started at step ``seq`` of run ``run`` of ``parent_id``.

    Run 0 keeps the historical ``<parent>-c<seq>``; later runs (continue-as-new) add
    ``.r<run>``, so no run's id can equal another's (``-c{run}{seq}`` made run 0 step 11 and
    run 1 step 1 both ``-c11``). A step taken after the n-th operator operation adds ``~<n>``.
    """
    return (f"{parent_id}-c{seq}.r{run}" if run else f"{parent_id}-c{seq}") + rerun_suffix(reruns)


def rerun_suffix(reruns: int) -> str:
    """``~<n>`` on the default ids of steps taken after the n-th operator operation (reset,
    resume, retry: engine/admin/reruns.py); nothing before any, so first-run ids never change."""
    return f"~{reruns}" if reruns else ""


def default_effect_id(execution_id: str, run: int, seq: int, reruns: int = 0) -> str:
    """The id of the effect step ``seq`` emits without an explicit ``effect_id``."""
    return f"{execution_id}{f':{run}' if run else ''}:{seq:06d}{rerun_suffix(reruns)}"


def parse_step_id(doc_id: str) -> tuple[int, int]:
    """``"s2:000007"`` → ``(run 2, seq 7)`` (markers, results and wait decisions alike)."""
    head, _, tail = doc_id.partition(":")
    return int(head[1:] or 0), int(tail)


def activity_task_id(execution_id: str, run: int, seq: int) -> str:
    """The Celery task id of activity step ``seq`` of run ``run``: ``<id>:<seq>``, ``<id>:<run>:<seq>``."""
    return f"{execution_id}:{run}:{seq}" if run else f"{execution_id}:{seq}"


def task_id_of(marker: Mapping[str, Any]) -> str:
    """An activity marker's task id: derived (:func:`activity_task_id`; not stored since the
    marker is rewritten with each step, bench/cosmos_ru.py), or as an older marker recorded it."""
    recorded = marker.get("task_id")
    if isinstance(recorded, str):
        return recorded
    run = marker.get("run")
    return activity_task_id(str(marker["pk"]), run if isinstance(run, int) else 0, int(marker["seq"]))


def input_id(run: int = 0) -> str:
    """``in:payload`` (run 0), ``in2:payload`` (run 2): a run's input kept apart from the exec."""
    return f"in{_run(run)}:payload"


def run_prefixes(run: int) -> tuple[str, ...]:
    """Id prefixes of the step, outcome, signal decision and input documents of one run."""
    return (f"s{_run(run)}:", f"r{_run(run)}:", f"w{_run(run)}:", f"sig{_run(run)}:", f"in{_run(run)}:")


def is_step_id(doc_id: str) -> bool:
    """Whether ``doc_id`` is a step marker (``s:…``/``sN:…``), not a signal or result."""
    head, sep, tail = doc_id.partition(":")
    return bool(sep) and head[:1] == "s" and (head == "s" or head[1:].isdigit()) and tail.isdigit()


def external_signal_id(execution_id: str, run: int, seq: int, resets: int = 0) -> str:
    """The deterministic id of the signal step ``seq`` of run ``run`` of ``execution_id`` sends:
    every retry of the send carries the same one, so the receiver records it once. A step taken
    again after an operator's operation (``resets``: the rerun count) sends anew."""
    return f"{execution_id}:{run}:{seq}" + rerun_suffix(resets)


def signal_key_id(signal_id: str) -> str:
    """``sgk:<digest>``: where a receiver records that it accepted ``signal_id`` (any characters:
    hashed, as store ids refuse some)."""
    return SIGNAL_KEY_PREFIX + hashlib.sha256(signal_id.encode()).hexdigest()[:40]


def operation_id(n: int) -> str:
    """``op:000001``: the n-th operator action recorded on an execution."""
    return f"{OPERATION_PREFIX}{n:06d}"
