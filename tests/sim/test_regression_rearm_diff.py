"""Regression (issue 23, found by ``bench/sim.py --seeds 2000`` after the merge of the operator
operations): a resume re-armed three activity steps of a cancelled fan-out; its pending op kept
only the fields that differed from the markers *as planned*, and the finishing batch applied them
to the markers as read *then*. A marker changed in between (``due_kind`` cleared) was re-armed
without its due time: its message lost, nothing was ever due again, and the execution stayed
running for ever (invariant 5). Seed 401 showed it; it fails on the old ``pending_ops._diff``."""

from __future__ import annotations

from celery_durable.testing.sim import Faults, check_seed
from celery_durable.testing.sim_store import KNOWN_BUGS, OPEN_BUGS


def test_seed_401_a_resumed_fan_out_is_never_left_with_nothing_due() -> None:
    check_seed(401, Faults.parse("all"), [b for b in KNOWN_BUGS if b not in OPEN_BUGS])
