"""Which activity delivery may complete which step marker (issue 23, item 1).

A step number alone does not name a call: an operator's reset forgets step N and the re-run
records a new step N (maybe with other arguments), a retry re-runs a failed one, a purged id is
started again. A message sent for the old marker may still be queued. So the marker keeps a
``token`` when it is first taken — a digest of (execution id, run, step, the execution's
``resets``) — and every message of it carries the token (header field ``t``). ``retry`` rotates
it (random): an old message of the failed attempt is then stale too. ``resume`` keeps it (the
same call goes on). A delivery must bring the marker's token, its activity name and its input
(compared by digest): anything else is stale and dropped. A legacy marker (written before
tokens) has none and accepts only a token-less message: a rolling upgrade keeps working.
The attempt keeps the token it began on, and its outcome is recorded only while its step's
marker still has it (:func:`stale_outcomes`): an operation may forget the step meanwhile.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_durable.engine.dispatcher import ActivityRequest, Send
from celery_durable.engine.documents.model import run_of
from celery_durable.engine.documents.records import is_terminal
from celery_durable.engine.documents.schema import EXEC_ID, marker_id, result_id, task_id_of
from celery_durable.stores.base import Doc

__all__ = [
    "Delivery",
    "step_token",
    "rotated_token",
    "input_digest",
    "refusal",
    "stamped",
    "marker_token",
    "stale_outcomes",
    "STALE_EVENT",
    "request_of",
    "not_runnable",
]

#: the engine event (so counter and Prometheus ``events_total``) of a dropped stale delivery
STALE_EVENT = "activity_stale_delivery"


def step_token(execution_id: str, run: int, seq: int, resets: int, life: str = "") -> str:
    """The token of a marker first taken at step ``seq`` of ``run`` after ``resets`` resets, in
    the execution's ``life`` (its ``incarnation``: an id purged and started again is a new life,
    so a message of the purged execution cannot complete the new one's step)."""
    key: list[Any] = [execution_id, run, seq, resets] + ([life] if life else [])
    text = json.dumps(key, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def rotated_token() -> str:
    """A fresh random token (``retry``: no message of the failed attempt may complete the step)."""
    return secrets.token_hex(12)


def _canon(value: Any) -> Any:
    """``value`` with every number as a float: a store may give ``1.0`` back as ``1`` (Cosmos'
    numbers are JavaScript's), or a large integer as the nearest double."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:
            return str(value)
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    return value


def input_digest(args: Any, kwargs: Any) -> str:
    """Digest of a call's JSON arguments, as any store gives them back (key order and number
    types do not matter; lists and tuples are alike)."""
    canon = _canon([list(args or []), dict(kwargs or {})])
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Delivery:
    """What one activity message claims to be: the marker's token, the activity, its input."""

    token: str | None
    name: str
    #: :func:`input_digest` of the message's arguments; None: not compared (an in-process run
    #: that took its arguments from the marker itself)
    digest: str | None = None

    @classmethod
    def of(cls, token: Any, name: str, args: Any, kwargs: Any) -> Delivery:
        return cls(str(token) if token is not None else None, name, input_digest(args, kwargs))

    @classmethod
    def of_request(cls, request: ActivityRequest) -> Delivery:
        """The delivery of ``request``'s message as sent (in-process dispatchers, the simulation)."""
        return cls.of(request.token, request.name, request.args, request.kwargs)


def refusal(marker: Doc, delivery: Delivery) -> str | None:
    """Why ``delivery`` does not belong to ``marker`` (None: it does)."""
    want = marker.get("token")
    if want is None or delivery.token is None:
        if want is not None or delivery.token is not None:
            return "stale delivery: its token does not match the step's"
    elif not hmac.compare_digest(str(want), delivery.token):
        return "stale delivery: its token does not match the step's"
    if str(marker.get("name")) != delivery.name:
        return f"stale delivery: the step runs {marker.get('name')!r}, not {delivery.name!r}"
    if delivery.digest is not None:
        payload = marker.get("input") or {}
        if input_digest(payload.get("args"), payload.get("kwargs")) != delivery.digest:
            return "stale delivery: its arguments are not the step's"
    return None


def stamped(new_docs: Iterable[Doc], sends: list[Send], resets: int, life: str = "") -> tuple[list[Doc], list[Send]]:
    """A replay's new documents and sends, each new activity marker given its token and each
    activity request the token of its marker (the replay's last step before the commit)."""
    docs = list(new_docs)
    tokens: dict[int, str] = {}
    for doc in docs:
        if doc.get("kind") != "activity" or doc.get("local"):
            continue  # a local activity runs in the drive: no message to prove anything
        if doc.get("token") is None:
            doc["token"] = step_token(str(doc["pk"]), run_of(doc), int(doc["seq"]), resets, life)
        tokens[int(doc["seq"])] = str(doc["token"])
    if not tokens:
        return docs, sends
    out: list[Send] = [
        dataclasses.replace(s, token=tokens[s.seq])
        if isinstance(s, ActivityRequest) and s.token is None and s.seq in tokens
        else s
        for s in sends
    ]
    return docs, out


def marker_token(marker: Doc) -> str | None:
    """The token a message for ``marker`` carries (None: a legacy marker, a token-less message)."""
    token = marker.get("token")
    return str(token) if token is not None else None


def stale_outcomes(
    docs: Mapping[str, Doc], run: int, carry: Iterable[Doc], tokens: Mapping[int, str | None]
) -> set[int]:
    """The steps of the outcomes in ``carry`` (of run ``run``) whose marker in ``docs`` is not
    the one their attempt began on (``tokens``: step -> that marker's token), or is gone.

    An attempt's token is checked when it begins; but an operator's reset or retry may forget
    its step while it runs, and the re-run take the step number anew: its outcome must not be
    recorded there. The caller's commit is conditional on the exec's etag, which every such
    operation changes, so this check and that write are one."""
    stale: set[int] = set()
    for doc in carry:
        seq = doc.get("seq")
        if doc.get("type") != "result" or run_of(doc) != run or not isinstance(seq, int):
            continue
        if seq not in tokens:
            continue
        marker = docs.get(marker_id(seq, run))
        if marker is None or marker.get("kind") != "activity" or marker_token(marker) != tokens[seq]:
            stale.add(seq)
    return stale


def request_of(execution_id: str, marker: Doc, ex: Mapping[str, Any] | None) -> ActivityRequest:
    """The message of the step ``marker`` records, sent again (a recovery re-send, a slot granted)."""
    payload = marker["input"]
    return ActivityRequest(
        execution_id=execution_id,
        seq=int(marker["seq"]),
        name=str(marker["name"]),
        args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})),
        task_id=task_id_of(marker),
        workflow=str((ex or {}).get("workflow", "")),
        run=run_of(marker),
        token=marker_token(marker),
    )


def not_runnable(docs: Mapping[str, Doc], seq: int, run: int) -> str | None:
    """Why no attempt of step ``seq`` of ``run`` may begin on this partition (None: one may)."""
    ex = docs.get(EXEC_ID)
    if ex is None:
        return "no such execution"
    if is_terminal(ex):
        return f"execution is {ex['status']}"
    if run_of(ex) > run:
        return "the execution continued as new"
    if run_of(ex) < run:  # the message follows a run we do not see (yet)
        return f"the run is not yet {run}"
    if result_id(seq, run) in docs:
        return "duplicate: the result is already recorded"
    marker = docs.get(marker_id(seq, run))
    if marker is None or marker.get("kind") != "activity":
        return "no such activity step"
    return None
