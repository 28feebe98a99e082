"""The engine's documents as types: one ``TypedDict`` per kind of document, and their accessors.

A store hands back plain JSON objects (``stores.base.Doc``); :mod:`.checks` checks the shape of
each engine document once as it is read (``check_shape``), and the code that uses them reads them
through these types, so a field's name and type are written down once, here, instead of at each
``doc.get("…")``. Every type is ``total=False``: a document written by an older version may lack
a field added later, so the accessors below say what an absent field means (``run`` absent is
run 0, a count absent is 0, no lease is ``None``). Values are the stored JSON, unchanged: a
status is the plain string ``"running"`` (``Status`` members compare equal to it).

``FIELDS`` lists each type's fields; ``undeclared`` reports the fields its type does not declare,
checked over every document tests store (tests/engine/test_records.py); see architecture.md §5.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from celery_durable.engine.documents import update_docs as upd
from celery_durable.engine.documents.limit_docs import LimitDoc, StepLimitInfo
from celery_durable.engine.documents.schedule_docs import ScheduleDoc
from celery_durable.engine.documents.schema import EXEC_ID, TERMINAL, DocType

__all__ = [
    "Lease",
    "LaneLease",
    "ErrorInfo",
    "ParentRef",
    "ActivityInput",
    "EffectIntent",
    "ExecDoc",
    "MarkerDoc",
    "OutcomeDoc",
    "WaitDecisionDoc",
    "SignalValueDoc",
    "SignalMarkDoc",
    "OperationDoc",
    "LaneHeadDoc",
    "LaneRowDoc",
    "OperationPartDoc",
    "PurgeRecordDoc",
    "SignalKeyDoc",
    "SealKeyDoc",
    "EffectIndexDoc",
    "EffectIntentDoc",
    "ClockDoc",
    "FIELDS",
    "KINDS",
    "as_exec",
    "maybe_exec",
    "run_of",
    "seq_of",
    "count_of",
    "lease_of",
    "holder_of",
    "is_terminal",
    "undeclared",
    "record_type",
]


class Lease(TypedDict, total=False):
    """Who holds an exec's drive or a step's attempt, until when (epoch seconds)."""

    holder: str
    expires: float


class LaneLease(TypedDict, total=False):
    """Who runs an outbox row's handler, until when."""

    owner: str
    expires: float


class ErrorInfo(TypedDict, total=False):
    """An exception as stored (``model.error_info``); an exec's also says where it happened."""

    type: str
    message: str
    traceback: str
    attempts: int
    #: of an exec's error: the step that failed it, its run, and how many steps the run had taken
    step: int | None
    run: int
    taken: int


class ParentRef(TypedDict, total=False):
    """The step of another execution that waits on this one (a child's parent, a joiner)."""

    pk: str
    seq: int
    run: int


class ActivityInput(TypedDict, total=False):
    args: list[Any]
    kwargs: dict[str, Any]


class EffectIntent(TypedDict, total=False):
    """A portable copy of an outbox enqueue (an ``emit`` marker's or an intent's ``effect``)."""

    id: str
    type: str
    key: str
    payload: Any
    max_attempts: int
    replay_safe: bool
    available_at: float
    created_at: float


class _Doc(TypedDict, total=False):
    pk: str
    id: str
    type: str
    #: added by a read (stores.base): the version a guarded write must match
    _etag: str


class _Due(_Doc, total=False):
    #: a scan looks at the document once ``due_at`` passes (stores.base.Store.scan_due); ``parked``:
    #: ``[due_kind, due_at]`` while its execution is paused (engine/admin/pause.py); ``held``: a
    #: step whose failure paused it (engine/activities/holds.py)
    due_kind: str | None
    due_at: float | None
    parked: list[Any] | None
    held: bool | None


class ExecDoc(_Due, upd.ExecUpdateFields, total=False):
    """``exec``: one execution (``model.new_exec_doc`` writes a new one)."""

    workflow: str
    run: int
    #: a fresh token per creation of the id (engine/drive/partition_cache.py)
    incarnation: str
    generation: int
    #: the run's input ``{"args", "kwargs"}``, or ``payload_at``: the document holding it (model.split_payload)
    payload: dict[str, Any]
    #: the dedup key it holds (``options(dedup_key=)``: engine/starts/dedup.py)
    dedup_key: str
    #: created ended by a start that took its dedup key before its own starter created it
    never_started: bool
    #: when it times out (``options(timeout=)``, a parent's cap; lifted by a re-run): engine/starts/deadlines.py
    deadline_at: float | None
    timed_out: bool | None  # the deadline's cancel: it delivers a :class:`WorkflowTimedOutError`
    start_at: float  # a delayed start's first drive (``options(start_delay=)``: ``scheduled`` until then)
    debounce: float  # a debounced start's quiet period (``options(debounce=)``: engine/starts/debounce.py)
    paused: bool | None  # an operator paused it, when (engine/admin/pause.py)
    paused_at: float | None
    #: the limit it waits on (``queued`` since ``queued_at``), held while it runs (engine/limits/workflows.py)
    limit: StepLimitInfo
    queued_at: float
    payload_at: str
    parent: ParentRef | None
    #: other executions' steps joined to this one (a parent that attached to an existing child)
    joiners: list[ParentRef]
    signals: list[str] | None
    status: str
    cancel_requested: bool
    #: the steps taken when the cancel was requested: their running attempts stop, later steps
    #: (compensations) do not (engine/activities/leases.py)
    cancel_before: int
    cancelled_by_parent: bool | None
    parent_notified: bool | None
    result: Any
    error: ErrorInfo | None
    #: why the execution cannot be driven here (its workflow is not registered in this worker)
    last_error: str | None
    lease: Lease | None
    wakeups: int
    drives: int
    steps: int
    continued: int
    signal_seq: int
    custom_status: Any
    #: what a suspended execution waits on: per awaited step its kind, name, deadline (``until``)
    waiting: list[dict[str, Any]]
    search: dict[str, Any]
    search_run: dict[str, Any]
    memo: Any
    #: an operator operation's unfinished rest (engine/admin/pending_ops.py)
    pending_op: dict[str, Any] | None
    operations: int
    last_op: str
    reruns: int
    resets: int
    retried: int
    #: a child created ahead of its parent's step (engine/children/links.py)
    fence: bool
    purging: bool
    #: the exec as it was when found malformed (engine/drive/corrupt.py)
    malformed: Any
    created_at: float
    updated_at: float
    completed_at: float | None


class HeartbeatInfo(TypedDict, total=False):
    """A step's latest heartbeat details, written with a lease renewal or a retry's release."""

    details: Any
    at: float
    attempt: int


class MarkerDoc(_Due, upd.MarkerUpdateFields, total=False):
    """``s:000007``: what step 7 is (``kind`` and ``name``, checked on replay) and its progress."""

    kind: str
    name: str
    seq: int
    run: int
    created_at: float
    # activity
    input: ActivityInput
    task_id: str
    token: str
    attempts: int
    lost: int
    started_at: float
    lease: Lease | None
    last_error: ErrorInfo | None
    #: the last failed attempt's end and when the next may start (its backoff, for the timeline)
    failed_at: float
    retry_at: float
    #: the latest ``activity.heartbeat(details)`` an attempt sent (engine/activities/context.py)
    heartbeat: HeartbeatInfo
    #: a limited activity's key, priority and group (engine/limits/)
    limit: StepLimitInfo
    resends: int
    resent_at: float
    resent_due: float
    local: bool
    # child
    child_id: str
    child_reruns: int
    #: the child's deadline (the earlier of its own timeout and the parent's), its limit's record
    deadline_at: float
    child_limit: StepLimitInfo
    # sleep, signal wait
    fire_at: float
    decision: str
    names: list[str]
    # emit
    effect: EffectIntent
    admitted: bool
    conflict: str
    reason: str
    rerun: int
    # signal_send
    signal_id: str
    target: str
    #: when a send first found no target on a store whose reads may lag (engine/signals/external.py)
    target_unseen: float
    # now, uuid, seed, patch: the recorded answer; done: the step whose future it answered
    value: Any
    of: int


class ClockDoc(_Due, total=False):
    """``clock:deadline``/``clock:start``: a deadline or delayed start, due at ``at`` (engine/starts/deadlines.py)."""

    kind: str
    at: float
    fired_at: float


class OutcomeDoc(_Doc, total=False):
    """``r:000007``: the outcome of step 7, create-only (first writer wins)."""

    seq: int
    run: int
    name: str
    ok: bool
    value: Any
    error: ErrorInfo | None
    attempts: int
    token: str
    cancelled: bool
    cancel_at: int
    cancelled_by_parent: bool
    timeout: bool
    fired_at: float
    #: a timed wait's timer: how many signal values the exec had when it fired
    signals_seen: int
    child_id: str
    child_reruns: int
    #: a child step whose id another execution holds (the step fails; engine/children/links.py)
    taken: bool
    target: str
    #: of a local activity (run in the drive: engine/activities/local_activities.py)
    local: bool
    completed_at: float


class WaitDecisionDoc(_Doc, total=False):
    """``w:000004``: what the signal wait at step 4 consumed, or its timeout; create-only."""

    seq: int
    run: int
    name: str
    ok: bool
    value: Any
    value_id: str
    sent_at: float
    received_at: float
    timeout: bool
    fired_at: float
    cancelled: bool
    error: ErrorInfo | None


class SignalValueDoc(_Doc, total=False):
    """``sgv:000003``: the 3rd signal value sent to the execution."""

    n: int
    name: str
    value: Any
    run: int
    sent_at: float
    #: of a value sent by a workflow (``wf.signal_external``): its send's id and who sent it
    signal_id: str
    sender: Any


class SignalMarkDoc(_Doc, total=False):
    """``sgx:000003``: how value 3 was settled (consumed, rejected, ignored)."""

    name: str
    value_id: str
    run: int
    seq: int
    at: float
    value: Any
    error: ErrorInfo | None


class OperationDoc(_Doc, total=False):
    """``op:000001``: an operator's action on the execution (engine/admin/oplog.py)."""

    action: str
    by: str
    at: float
    reason: str | None
    run: int
    step: int
    status: str
    name: str
    error: ErrorInfo
    forgotten: list[Any]
    forgotten_children: list[Any]
    forgotten_more: int
    archive_parts: int
    parent_op: str


class LaneHeadDoc(_Due, total=False):
    """``fxq:{key}/head``: an outbox lane's next number, live rows and holder (outbox/model.py)."""

    key: str
    next_seq: int
    #: ``[seq, effect_id, type]`` of the pending and running rows, in ``seq`` order
    live: list[list[Any]]
    running: str | None
    waiting: list[list[Any]]
    stored: int
    freed_at: float


class LaneRowDoc(_Due, total=False):
    """``fxq:{key}/fx:{effect_id}``: one effect in its lane."""

    key: str
    seq: int
    effect_id: str
    effect_type: str
    payload: Any
    digest: str
    token: str
    status: str
    attempt: int
    max_attempts: int
    replay_safe: bool
    available_at: float
    eligible_at: float
    lease: LaneLease | None
    lost: int
    last_error: str | None
    reason: str | None
    source: dict[str, Any] | None
    created_at: float
    started_at: float | None
    completed_at: float | None
    #: a failed row run again (``durable outbox retry``): the new row's effect id
    retried_as: str | None


class OperationPartDoc(_Doc, total=False):
    """``op:000001.2``: the rest of an operation's archive of forgotten steps (engine/admin/oplog.py)."""

    op: str
    part: int
    forgotten: list[Any]


class PurgeRecordDoc(_Doc, total=False):
    """``purged``, ``purged:2``…: who purged the execution, when, and what it was (engine/admin/purge.py)."""

    action: str
    by: str
    at: float
    reason: str | None
    workflow: str | None
    status: str | None
    documents: int
    reruns: int
    #: of a child deleted by its parent's operation (engine/admin/child_ops.py): which, and whose
    op: str
    parent: str


class SignalKeyDoc(_Doc, total=False):
    """``sgk:<hash>``: a value sent by another workflow was recorded (as ``value_id``)."""

    value_id: str


class SealKeyDoc(_Doc, total=False):
    """The store's message-sealing key (engine/drive/seals.py)."""

    secret: str


class EffectIndexDoc(_Doc, total=False):
    """``fxid:{effect_id}/fx``: what an effect id was first enqueued with (engine/outbox/model.py)."""

    key: str
    effect_type: str
    digest: str
    token: str
    created_at: float
    touched_at: float


class InputDoc(_Doc, total=False):
    """``in:payload`` (``in2:payload`` in run 2): a run's input too large to ride in the exec,
    written once with the run (``model.split_payload``)."""

    run: int
    payload: dict[str, Any]


class EffectIntentDoc(_Due, total=False):
    """``fxi:{effect_id}``: an enqueue waiting for admission into its lane, in the caller's partition."""

    effect: EffectIntent
    admitted: bool
    cancelled: str
    conflict: str
    reason: str


class DedupOwnerDoc(_Doc, total=False):
    """``dk:<digest>/owner``: the execution that last took a dedup key (engine/starts/dedup.py)."""

    key: str
    execution: str
    #: its workflow: a start that takes the key from an owner never created creates it ended
    workflow: str
    claimed_at: float
    #: the running owner a ``latest-wins`` start cancelled to take the key
    superseded: str


#: every document type's declared fields
FIELDS: dict[str, frozenset[str]] = {
    name: frozenset(t.__annotations__)  # a TypedDict's annotations hold its bases' keys too
    for name, t in {
        "exec": ExecDoc,
        "marker": MarkerDoc,
        "outcome": OutcomeDoc,
        "wait_decision": WaitDecisionDoc,
        "signal_value": SignalValueDoc,
        "signal_mark": SignalMarkDoc,
        "operation": OperationDoc,
        "lane_head": LaneHeadDoc,
        "lane_row": LaneRowDoc,
        "operation_part": OperationPartDoc,
        "purge_record": PurgeRecordDoc,
        "signal_key": SignalKeyDoc,
        "seal_key": SealKeyDoc,
        "effect_index": EffectIndexDoc,
        "effect_intent": EffectIntentDoc,
        "input": InputDoc,
        "dedup_owner": DedupOwnerDoc,
        "clock": ClockDoc,
        "limit": LimitDoc,
        "schedule": ScheduleDoc,
        **upd.UPDATE_FIELDS,
    }.items()
}

#: a document's ``type`` -> which of :data:`FIELDS` it is
KINDS: dict[str, str] = {
    DocType.EXEC: "exec",
    DocType.STEP: "marker",
    DocType.RESULT: "outcome",
    DocType.SIGNAL: "wait_decision",
    DocType.SIGNAL_VALUE: "signal_value",
    DocType.SIGNAL_REJECTED: "signal_mark",
    DocType.SIGNAL_IGNORED: "signal_mark",
    "signal_consumed": "signal_mark",
    DocType.SIGNAL_KEY: "signal_key",
    DocType.OPERATION: "operation",
    DocType.OPERATION_PART: "operation_part",
    "purged": "purge_record",
    "key": "seal_key",
    "effect_lane": "lane_head",
    "effect": "lane_row",
    "effect_index": "effect_index",
    "effect_intent": "effect_intent",
    DocType.INPUT: "input",
    "dedup_key": "dedup_owner",
    DocType.CLOCK: "clock",
    DocType.LIMIT: "limit",
    DocType.SCHEDULE: "schedule",
    **upd.UPDATE_KINDS,
}


def record_type(doc: Mapping[str, Any]) -> str | None:
    """Which of :data:`FIELDS` a stored document is, from its ``type``; ``None``: not the engine's."""
    kind = doc.get("type")
    if kind is None:  # an exec written before documents had types
        return "exec" if doc.get("id") == EXEC_ID else None
    return KINDS.get(kind) if isinstance(kind, str) else None


def undeclared(doc: Mapping[str, Any]) -> set[str]:
    """The fields of ``doc`` its type does not declare (empty for a document of no known type).

    Keys starting with ``_`` or ``~`` belong to the stores (``_etag``, the offload manifest)."""
    kind = record_type(doc)
    if kind is None:
        return set()
    return {k for k in doc if k not in FIELDS[kind] and not k.startswith(("_", "~"))}


# -- decoding: a document already checked by checks.check_shape, typed ------------------------


def as_exec(doc: Mapping[str, Any]) -> ExecDoc:
    """``doc`` (an exec, checked by ``check_shape``) as an :class:`ExecDoc`."""
    return cast(ExecDoc, doc)


def maybe_exec(doc: Mapping[str, Any] | None) -> ExecDoc | None:
    """An exec read without the shape check (a holder of an id, a child looked at from its
    parent, whose malformation is its own execution's to report), typed; ``None`` stays."""
    return None if doc is None else cast(ExecDoc, doc)


# -- accessors: what an absent field means ----------------------------------------------------


def run_of(doc: Mapping[str, Any]) -> int:
    """The run (0, then one more per continue-as-new) a document belongs to; absent means 0."""
    return int(doc.get("run") or 0)


def seq_of(doc: Mapping[str, Any]) -> int:
    """The step number of a marker, outcome or decision (``parent`` refs too); absent means 0."""
    return int(doc.get("seq") or 0)


def count_of(doc: Mapping[str, Any], field: str) -> int:
    """A counter field (``wakeups``, ``drives``, ``steps``, ``attempts``, …); absent means 0."""
    return int(doc.get(field) or 0)


def lease_of(doc: Mapping[str, Any]) -> Lease | None:
    """The document's lease, or ``None`` when none is held."""
    lease = doc.get("lease")
    return cast(Lease, lease) if lease else None


def holder_of(doc: Mapping[str, Any]) -> str | None:
    """Who holds the document's lease (``None``: no one)."""
    lease = lease_of(doc)
    return None if lease is None else lease.get("holder")


def is_terminal(ex: Mapping[str, Any]) -> bool:
    """Whether the execution has finished (completed, failed, cancelled or timed out)."""
    return ex.get("status") in TERMINAL
