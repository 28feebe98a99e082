"""Regressions from the adversarial review of the outbox v2 (issue 11; README "Effect outbox",
docs/architecture.md §9).

Each test was written by a reviewer whose only job was to break the outbox, and failed on the
code it was written against (e5564dc): its docstring states the promise and how it broke; its
name describes that break. They pass since the fixes. The real-worker ones are in
tests/integration/test_adversarial_outbox.py; the runtime ones in
test_regressions_outbox_runtime.py. Deterministic: patched store methods, a fake clock and the
in-process harness of ``outbox_env`` (the Celery glue with a fake task where the glue matters).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable.engine.outbox import RUNNING, SUCCEEDED, EffectRef
from celery_durable.engine.outbox.runtime import execute
from celery_durable.errors import LaneFull, StoreUnavailable
from celery_durable.stores import Store
from celery_durable.stores.base import Doc, Op
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.sqlite.store import SqliteStore
from tests.engine.outbox_env import Env, FakeClock, Glue


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(str(tmp_path / "outbox.db"))
    yield s
    s.close()


def make_env(store: Store, replay_safe: bool = True, **settings: Any) -> tuple[Env, list[Any]]:
    """An Env with one handler ``note`` that records the payloads it ran with."""
    env = Env(store, **settings)
    ran: list[Any] = []

    @env.handler("note", replay_safe=replay_safe)
    def note(payload: Any) -> None:
        ran.append(payload)

    return env, ran


def intent_in(env: Env, pk: str, effect_id: str, key: str, payload: Any = 1) -> Doc:
    """A transactional enqueue committed with the caller's order document, not admitted yet."""
    body = env.outbox.effect_body(
        "note", payload, key=key, effect_id=effect_id, available_at=None, replay_safe=True, max_attempts=3
    )
    intent = env.outbox.intent(pk, body)
    env.store.batch(pk, [Op.create({"pk": pk, "id": f"order-{effect_id}"}), Op.create(intent)])
    return intent


def settle_everything(env: Env, rounds: int = 6) -> None:
    """Let time pass well beyond every lease and queue timeout, scanning and delivering each time."""
    for _ in range(rounds):
        env.drain()
        env.clock.advance(max(env.settings.lease_ttl, env.settings.queue_timeout, env.settings.admit_grace) + 1)
        env.outbox.scan()
    env.drain()


def applied_then_lost(store: Store, method: str, when: Callable[..., bool]) -> list[int]:
    """Patch ``store.<method>``: the first call matching ``when`` is applied, then its answer is
    lost (``StoreUnavailable``, as a timeout after the commit). Returns a list that counts hits."""
    original = getattr(store, method)
    hits: list[int] = []

    def patched(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if not hits and when(*args, **kwargs):
            hits.append(1)
            raise StoreUnavailable(f"injected: the answer of {method} was lost after it applied")
        return result

    setattr(store, method, patched)
    return hits


# --- the Celery glue, in process: a Durable on a memory store, an in-process sender, a fake task ---


@pytest.fixture
def glue() -> Iterator[Glue]:
    g = Glue()
    yield g
    g.close()


# === Finding 1: a claim whose answer is lost ======================================================


def test_a_claim_applied_but_answered_with_a_store_error_fails_a_process_bound_effect_that_never_ran(
    glue: Glue,
) -> None:
    """Promise (Leases): "replay_safe=False types are failed with the reason" only when "a worker
    dies mid-handler" -- "the store fails right after the handler ran". Break: the claim batch
    commits but its answer is lost (a timeout after the commit: StoreUnavailable). ``deliver``
    retries the message (countdown 1 s); the redelivery's claim finds the row RUNNING under the
    lost attempt's lease and returns "duplicate"; nobody runs the handler; when that lease
    expires the scan fails the process-bound effect "after execution started" -- it never ran.
    (A replay-safe effect loses one attempt and waits a lease TTL.)"""
    ran: list[Any] = []

    @glue.durable.effect("adv.charge", replay_safe=False)
    def charge(payload: dict[str, Any]) -> None:
        ran.append(payload)

    glue.outbox.enqueue("adv.charge", {"n": 1}, key="k", effect_id="c1")
    applied_then_lost(glue.store, "batch", lambda pk, ops: any((op.doc or {}).get("status") == RUNNING for op in ops))
    glue.deliver_all()  # the claim's answer is lost; Celery's retry redelivers it
    for _ in range(3):
        glue.pass_time(glue.core.settings.lease_ttl + 1)
    info = glue.outbox.get("c1")
    assert info is not None
    assert (info.status, ran) == (SUCCEEDED, [{"n": 1}]), (
        f"the effect never ran, yet it is {info.status!r}: {info.reason}"
    )


def test_a_draining_settle_applied_but_answered_with_a_store_error_fails_the_next_effect_unrun(
    store: Store,
) -> None:
    """Promise (Order/drain + Leases): a delivery that finishes a row "runs the key's next row
    itself, claimed in the same write"; a process-bound effect is failed only when its worker
    vanished after it started. Break: the settle+claim batch of row A commits, its answer is lost
    (StoreUnavailable). ``execute`` falls back to settling A as failed, finds A succeeded and
    reports "lease-lost"; ``claim.successor`` is never set, so B -- RUNNING under this worker's
    lease -- is run by nobody. When the lease expires the scan fails B "after execution started";
    B never ran."""
    env, ran = make_env(store, replay_safe=False)
    env.enqueue("note", "A", key="k", effect_id="A")
    env.enqueue("note", "B", key="k", effect_id="B")
    env.sender.take()
    claim = env.outbox.claim("k", "A").claim
    assert claim is not None
    applied_then_lost(store, "batch", lambda pk, ops: any((op.doc or {}).get("status") == SUCCEEDED for op in ops))
    outcome = execute(env.outbox, claim, env.effects.require("note"), env.keeper, claim_next=("note",))
    if claim.successor is not None:  # what Outbox._run does with a drained successor
        execute(env.outbox, claim.successor, env.effects.require("note"), env.keeper)
    settle_everything(env)
    assert env.row("k", "A")["status"] == SUCCEEDED
    b = env.row("k", "B")
    assert (b["status"], ran) == (SUCCEEDED, ["A", "B"]), (
        f"A's outcome {outcome.kind!r}; B never ran, yet it is {b['status']!r}: {b.get('reason')}"
    )


# === Finding 2: cancel misses intents it cannot admit =============================================


def test_cancel_by_key_leaves_an_intent_waiting_for_a_full_lane_to_run_later(store: Store) -> None:
    """Promise (Cancel): "Effects not yet admitted (a transactional enqueue or an emit in flight)
    are cancelled too." Break: the key's lane is full, so a transactional enqueue's intent waits
    (README: "a lane that fills in between leaves the intent waiting"). ``cancel(key=...)``
    first tries to admit the key's intents -- LaneFull, logged and skipped -- then cancels the
    live rows. The cancelled rows leave the lane, the scan admits the intent, and the effect of
    the cancelled key runs after the cancel returned."""
    env, ran = make_env(store, max_lane_backlog=1, admit_grace=5.0)
    env.enqueue("note", "first", key="k", effect_id="first")
    intent_in(env, "orders", "late", "k", payload="late")
    env.sender.take()
    cancelled = env.outbox.cancel(key="k")
    settle_everything(env)
    late = env.outbox.get("late")
    assert ran == [], f"cancel(key='k') returned {cancelled}, then ran {ran} (late is {late and late['status']})"


def test_cancel_by_id_of_an_intent_waiting_for_a_full_lane_returns_0_and_it_runs_later(store: Store) -> None:
    """Promise (Cancel): "Cancel pending ... effects by id ... Effects not yet admitted ... are
    cancelled too." Break: the intent of effect ``late`` waits for room in its full lane;
    ``cancel("late")`` cannot admit it (LaneFull is only logged), finds no index and returns 0;
    when the lane drains the scan admits ``late`` and it runs."""
    env, ran = make_env(store, max_lane_backlog=1, admit_grace=5.0)
    env.enqueue("note", "first", key="k", effect_id="first")
    intent_in(env, "orders", "late", "k", payload="late")
    env.sender.take()
    cancelled = env.outbox.cancel("late")
    settle_everything(env)
    assert "late" not in ran, f"cancel('late') returned {cancelled}, yet the effect ran: {ran}"


def test_cancel_misses_an_unadmitted_intent_behind_a_thousand_others(store: Store) -> None:
    """Promise (Cancel): effects not yet admitted are cancelled too. Break: ``cancel`` looks for
    them with one ``scan_due(outbox_admit, ..., limit=1000)``: with 1000 older intents pending
    anywhere in the store (a burst of transactional enqueues, or intents waiting for full
    lanes), the 1001st -- the one being cancelled -- is not seen; cancel returns 0 and the
    effect runs."""
    env, ran = make_env(store, admit_grace=5.0)
    older = [
        env.outbox.intent(
            "burst",
            env.outbox.effect_body(
                "note", i, key=f"other-{i}", effect_id=f"o{i}", available_at=None, replay_safe=True, max_attempts=1
            ),
        )
        for i in range(1000)
    ]
    for i in range(0, len(older), 50):
        store.batch("burst", [Op.create(d) for d in older[i : i + 50]])
    env.clock.advance(1.0)
    intent_in(env, "orders", "target", "k", payload="target")
    cancelled = env.outbox.cancel("target")
    env.clock.advance(10.0)
    for _ in range(4):  # the scan admits 500 intents a pass
        env.outbox.scan()
    env.drain()
    assert "target" not in ran, f"cancel('target') returned {cancelled}, yet the effect ran"


# === Finding 3: an enqueue that committed reports a failure =======================================


def test_transactional_enqueue_raises_after_the_documents_and_the_effect_committed(glue: Glue) -> None:
    """Promise (Enqueue): "transactional: the effect commits with your documents or not at all".
    Break: the caller's batch (documents + intent) commits; the admission right after it hits a
    store error (the index write is refused: StoreUnavailable, nothing applied). ``enqueue``
    lets it escape, so the caller is told the enqueue failed -- yet the order is stored and beat's
    scan admits and runs the effect. (The engine's own ``emit`` path catches exactly this error
    and leaves the intent to the scan; ``Outbox.enqueue`` catches only LaneFull.) A caller that
    retries the failed call now gets a ConflictError on its own order id, or, with new ids,
    a second order and a second effect."""
    ran: list[Any] = []

    @glue.durable.effect("adv.receipt")
    def receipt(payload: dict[str, Any]) -> None:
        ran.append(payload)

    original = glue.store.create

    def create(doc: Doc) -> str | None:
        if doc.get("type") == "effect_index":
            raise StoreUnavailable("injected: the store is briefly unreachable")
        return original(doc)

    glue.store.create = create  # type: ignore[method-assign]
    raised: Exception | None = None
    try:
        glue.outbox.enqueue(
            "adv.receipt", {"order": 7}, key="u", effect_id="r7", with_docs=[{"pk": "orders", "id": "o7"}]
        )
    except StoreUnavailable as exc:
        raised = exc
    glue.store.create = original  # type: ignore[method-assign]
    committed = glue.store.read("orders", "o7") is not None
    glue.pass_time(glue.core.settings.admit_grace + 1)
    glue.deliver_all()
    assert raised is None or not committed, (
        f"enqueue raised {raised!r}, but the order committed (stored: {committed}) and the effect ran: {ran}"
    )


def test_enqueue_raises_a_broker_error_after_the_effect_committed_and_a_retry_runs_it_twice(glue: Glue) -> None:
    """Promise (Enqueue / Liveness): the effect is committed by the lane write; the message is only
    a wake-up (beat "re-sends claimable rows whose message was lost"). Break: the wake-up
    ``send_effect`` fails (broker unreachable) after the row+head batch committed; the broker
    error escapes ``enqueue`` and the caller is told the enqueue failed. The effect runs anyway
    (the scan resends it); a caller retrying an enqueue without ``effect_id`` (the default) gets
    a second effect: the side effect runs twice."""
    ran: list[Any] = []

    @glue.durable.effect("adv.mail")
    def mail(payload: dict[str, Any]) -> None:
        ran.append(payload)

    class BrokerDown(ConnectionError):
        pass

    real = glue.sender

    class FlakySender:
        calls = 0

        def send_effect(self, ref: Any, countdown: float | None = None) -> None:
            FlakySender.calls += 1
            if FlakySender.calls == 1:
                raise BrokerDown("injected: connection refused by the broker")
            real.send_effect(ref, countdown)

    glue.core.sender = FlakySender()
    outcomes: list[Any] = []
    for _ in range(2):  # the caller retries a failed enqueue once
        try:
            outcomes.append(glue.outbox.enqueue("adv.mail", {"to": "ann"}, key="user-1"))
            break
        except BrokerDown as exc:
            outcomes.append(exc)
    glue.core.sender = real
    glue.pass_time(glue.core.settings.queue_timeout + 1)
    glue.pass_time(glue.core.settings.queue_timeout + 1)
    assert ran == [{"to": "ann"}], f"enqueue answered {outcomes}; the handler ran {len(ran)} times"


# === Finding 4: empty ids are silently replaced ===================================================


def test_an_empty_effect_id_is_silently_replaced_by_a_random_one_so_a_repeat_runs_twice(glue: Glue) -> None:
    """Promise (Enqueue): "idempotent by effect_id: a repeat of the same request writes nothing ...
    and returns created=False". Break: ``effect_id=""`` (e.g. an unset field of the caller) is
    treated as "no id" (``effect_id or uuid4``): each repeat is a new effect, both run, and no
    error says the id was ignored. (Refusing it with a ConfigurationError would be fine.)"""
    ran: list[Any] = []

    @glue.durable.effect("adv.ping")
    def ping(payload: dict[str, Any]) -> None:
        ran.append(payload)

    try:
        first = glue.outbox.enqueue("adv.ping", {"n": 1}, key="k", effect_id="")
    except ValueError:
        return  # refused: fine (ConfigurationError is a ValueError)
    again = glue.outbox.enqueue("adv.ping", {"n": 1}, key="k", effect_id="")
    glue.deliver_all()
    assert (first.effect_id, again.created, len(ran)) == ("", False, 1), (
        f"effect_id='' became {first.effect_id!r} and {again.effect_id!r}; the handler ran {len(ran)} times"
    )


def test_an_empty_key_silently_drops_the_ordering(glue: Glue) -> None:
    """Promise (Order): effects of one key run strictly in order, one at a time. Break: ``key=""``
    (e.g. ``key=user.team or ""``) is silently replaced by each effect's own id (``key or eid``):
    the two effects go to two lanes and may run at once and out of order; ``Admitted.key`` is
    not the key asked for, and no error says so. (Refusing it would be fine.)"""

    @glue.durable.effect("adv.step")
    def step(payload: dict[str, Any]) -> None:
        pass

    try:
        a = glue.outbox.enqueue("adv.step", {"n": 1}, key="", effect_id="s1")
    except ValueError:
        return  # refused: fine (ConfigurationError is a ValueError)
    b = glue.outbox.enqueue("adv.step", {"n": 2}, key="", effect_id="s2")
    # both are claimable now: the second does not wait for the first
    claims = [glue.core.claim(x.key, x.effect_id).reason for x in (a, b)]
    assert (a.key, b.key, claims) == ("", "", ["claimed", "blocked"]), (
        f"key='' became {a.key!r} / {b.key!r}; claims {claims}"
    )


# === Finding 5: the documented clock-skew margin ==================================================


def test_a_live_handler_is_taken_over_at_a_clock_skew_inside_the_documented_margin(store: Store) -> None:
    """Promise (Leases): "Leases tolerate clock skew between workers and beat up to
    durable_lease_ttl - durable_heartbeat_interval (20 s by default)". Break: a handler's lease is
    only renewed at a heartbeat *beat* (every ``cancel_poll``, 1 s, in the rhythm of the
    process's keeper, not of this claim) once less than ``ttl - interval`` is left, so it can be
    renewed up to one poll later than that: the real margin is ``ttl - interval - cancel_poll``
    (19 s). With the holder's clock 19.6 s behind beat's, a live, beating handler's row is
    requeued by the scan and would run a second time elsewhere."""
    defaults = {"lease_ttl": 30.0, "heartbeat_interval": 10.0, "cancel_poll": 1.0}
    holder_clock, beat_clock = FakeClock(1_000_000.0), FakeClock(1_000_000.0 + 19.6)
    holder = Env(store, clock=holder_clock, **defaults)
    holder.handler("note")(lambda payload: None)
    beat = Env(store, clock=beat_clock, **defaults)
    holder.enqueue("note", 1, key="k", effect_id="e")
    claim = holder.outbox.claim("k", "e").claim
    assert claim is not None
    # the keeper beats every second, half a second out of phase with this claim (another handler
    # of the process set its rhythm); beat's scan runs every 0.05 s here (any phase of its 5 s)
    step, beats, states = 0.05, 0.5, []
    for _ in range(int(12.0 / step)):
        holder_clock.advance(step)
        beat_clock.advance(step)
        if holder_clock.now() - 1_000_000.0 >= beats:
            beats += 1.0
            states.append(holder.outbox.renew(claim))
        beat.outbox.scan()
    row = holder.row("k", "e")
    assert (row["status"], (row.get("lease") or {}).get("owner")) == (RUNNING, claim.owner), (
        f"skew 19.6 s < 20 s: the row is {row['status']!r}, lease {row.get('lease')}; the holder's beats: {states}"
    )


# === Finding 8: enqueue_many and the order of a key ===============================================


def test_enqueue_many_puts_a_reused_id_ahead_of_the_effects_listed_before_it(store: Store) -> None:
    """Promise (``enqueue_many``): "a key's rows keep the order given"; (Order) effects of one key
    run in the order they entered the lane. Break: ``admit_many`` admits at once, one by one, every
    effect whose id already has an index (here ``b``, settled longer ago than the retention, so a
    new request; likewise an id whose earlier enqueuer died after its index write), and only then
    the fresh ones in batches. Given ``[a, b]`` for one key, ``b`` gets the lower sequence number
    and runs first."""
    env, ran = make_env(store, retention=60.0)
    env.enqueue("note", "b-old", key="k", effect_id="b")
    env.drain()
    env.clock.advance(120)  # b's retention is over: enqueuing id b again is a new request
    bodies = [
        env.outbox.effect_body("note", p, key="k", effect_id=eid, available_at=None, replay_safe=True, max_attempts=3)
        for eid, p in (("a", "a"), ("b", "b-old"))
    ]
    admitted = env.outbox.admit_many(bodies)
    ran.clear()
    env.drain()
    order = [r["effect_id"] for r in env.outbox.rows("k") if r["status"] == SUCCEEDED]
    assert ran == ["a", "b-old"], f"enqueue_many([a, b]) -> {admitted}; ran in the order {ran} (lane order {order})"


# === Finding 9: the transactional enqueue's pre-check and a reused id =============================


def test_transactional_enqueue_of_an_expired_id_into_a_full_lane_commits_the_documents() -> None:
    """Promise (Enqueue): "beyond that enqueue raises LaneFull and writes nothing -- a
    transactional enqueue refuses before your documents commit". Break: ``check_admissible``
    skips the room check whenever the id has an index ("a repeat: never refused for a full
    lane"), but an id whose row settled longer ago than the retention is a *new* request
    (README: "The window is durable_outbox_retention"). Its documents commit, the lane is full,
    ``enqueue`` returns ``created=True`` -- and the effect waits instead of being refused."""
    glue = Glue(outbox_max_lane_backlog=1, outbox_retention=60.0)
    try:

        @glue.durable.effect("adv.tx")
        def tx(payload: dict[str, Any]) -> None:
            pass

        glue.outbox.enqueue("adv.tx", {"n": 1}, key="k", effect_id="x")
        glue.deliver_all()
        glue.clock.advance(120)  # x settled long ago: enqueuing x again is a new request
        glue.outbox.enqueue("adv.tx", {"n": 2}, key="k", effect_id="y")  # the lane is full now
        outcome: Any
        try:
            outcome = glue.outbox.enqueue(
                "adv.tx", {"n": 1}, key="k", effect_id="x", with_docs=[{"pk": "orders", "id": "o1"}]
            )
        except LaneFull as exc:
            outcome = exc
        committed = glue.store.read("orders", "o1") is not None
        assert isinstance(outcome, LaneFull) and not committed, (
            f"a full lane: enqueue answered {outcome!r} and the documents committed: {committed}"
        )
    finally:
        glue.close()


# === Finding 10: an enqueue refused for its size keeps its id =====================================


def test_an_enqueue_refused_as_too_large_keeps_the_id_so_the_corrected_retry_conflicts(store: Store) -> None:
    """Promise (Enqueue): idempotent by effect id; an ``IdempotencyConflict`` means "the id holds
    another request (the first enqueue stands)". Break: an enqueue whose row is too large for the
    store fails (DocumentTooLarge) *after* its index was written, and the index is not released
    (only LaneFull releases it). The corrected retry -- same id, smaller payload -- is refused with
    ``IdempotencyConflict`` although no request holds the id (for ``admit_grace + lease_ttl``;
    the orphan index itself is never deleted)."""
    from celery_durable.errors import DocumentTooLarge, IdempotencyConflict

    store.max_doc_bytes = 20_000
    env, ran = make_env(store)
    with pytest.raises(DocumentTooLarge):
        env.enqueue("note", {"blob": "x" * 30_000}, key="k", effect_id="big")
    outcome: Any
    try:
        outcome = env.enqueue("note", {"blob": "x" * 100}, key="k", effect_id="big")
    except IdempotencyConflict as exc:
        outcome = exc
    assert not isinstance(outcome, IdempotencyConflict), f"the corrected retry was refused: {outcome}"


# === Finding 12: an async handler "succeeds" without running ======================================


def test_an_async_handler_is_settled_succeeded_without_its_body_running(glue: Glue) -> None:
    """Promise (Enqueue/handlers): "a Celery worker runs its handler" and a row is ``succeeded``
    when the "handler returned". Break: ``@durable.effect`` accepts an ``async def`` handler (it
    only checks for one positional parameter); calling it returns a coroutine that is never
    awaited, so the effect is settled ``succeeded`` and its body -- the side effect -- never ran.
    No error, only a RuntimeWarning. (A generator function behaves the same.)"""
    ran: list[Any] = []

    try:

        @glue.durable.effect("adv.coro")
        async def send(payload: dict[str, Any]) -> None:
            ran.append(payload)

    except (TypeError, ValueError):
        return  # refused at registration: fine
    glue.outbox.enqueue("adv.coro", {"n": 1}, key="k", effect_id="a1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "coroutine ... was never awaited"
        glue.deliver_all()
    info = glue.outbox.get("a1")
    assert info is not None
    assert not (info.status == SUCCEEDED and not ran), "the async handler's row is 'succeeded'; its body never ran"


@pytest.mark.parametrize("effect_type", ["webhook:stripe", "order.return", "sms.2fa", "mail send"])
def test_an_effect_type_that_is_not_a_python_identifier_fails_with_a_syntax_error(effect_type: str) -> None:
    """Promise (README): an effect type is any name (``celery_durable.effect.<type>``; the examples
    use dotted names). Break: the handler task's function is named after the type's last dotted
    part (only ``-`` is replaced), and Celery compiles a signature for it: a type such as
    ``order.return``, ``webhook:stripe`` or ``sms.2fa`` makes ``@durable.effect`` fail with a
    ``SyntaxError`` from deep inside Celery ("invalid syntax") instead of registering, or refusing
    with a ConfigurationError that names the type."""
    from celery_durable.errors import ConfigurationError

    glue = Glue()
    try:
        try:

            @glue.durable.effect(effect_type)
            def handler(payload: dict[str, Any]) -> None:
                pass

        except ConfigurationError:
            return  # a clear refusal: fine
        except SyntaxError as exc:
            pytest.fail(f"@durable.effect({effect_type!r}) raised SyntaxError: {exc}")
        glue.outbox.enqueue(effect_type, {}, key="k", effect_id="e")
        glue.deliver_all()
        info = glue.outbox.get("e")
        assert info is not None and info.status == SUCCEEDED
    finally:
        glue.close()


# === Finding 13: an intent waiting for a full lane can wait forever ===============================


def test_an_intent_waiting_for_a_full_lane_starves_behind_a_producer_under_backpressure(store: Store) -> None:
    """Promise (Liveness / B1): an intent for a full lane "stays due (later) and never stops the
    scan ... the lane drains, then it gets in"; (README) "a lane that fills in between leaves the
    intent waiting". Break: the waiting intent only retries every ``admit_grace`` (beat's scan),
    while a producer that meets ``LaneFull`` simply retries its enqueue: whenever a slot frees,
    the producer takes it first. Under sustained load the committed transactional effect never
    enters its lane (here: 30 slots freed, 0 taken by the intent) although its caller was told
    ``created=True``."""
    env, ran = make_env(store, max_lane_backlog=2, admit_grace=5.0)
    n = 0

    def produce() -> None:  # a producer under backpressure: fill the lane whenever there is room
        nonlocal n
        while True:
            try:
                env.enqueue("note", f"p{n}", key="k", effect_id=f"p{n}")
                n += 1
            except LaneFull:
                return

    produce()
    intent_in(env, "orders", "receipt", "k", payload="receipt")  # committed; the lane is full
    env.sender.take()
    for _ in range(30):
        env.clock.advance(env.settings.admit_grace + 0.1)
        ref = env.outbox.head("k")["live"][0]  # type: ignore[index]
        env.deliver(EffectRef("k", ref[1], ref[2]))
        produce()  # the producer's retry loop runs far more often than beat's scan
        env.outbox.scan()
        env.sender.take()
    admitted = env.outbox.get("receipt")
    assert admitted is not None, f"30 slots freed in the lane ({len(ran)} effects ran); the intent never got in"
