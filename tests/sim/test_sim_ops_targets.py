"""Which executions the simulation's operator calls target (testing/sim_ops.py).

``--forge`` seed 137 once ended ``s137-8-w_generations`` failed (ChildWorkflowError). No forged
message did that: they were all refused. The cancel reached the parent at its child step and
cancelled the child too, then an operator's resume reopened the parent. The child still ended
cancelled and the parent failed on it. That is the open bug ``operator_compensations`` (resume
of a cancelled parent whose children were cancelled). The harness kept its trigger off for
w_parent but not for w_generations, which starts children as well, so the bug counted as a
violation. Only the random draws differ between the forging and the plain run, so a plain seed
can end the same way."""

from __future__ import annotations

from celery_durable.testing.sim import KNOWN_BUGS, Faults, Sim
from celery_durable.testing.sim_forge import ForgingSim, run_forged_seed
from celery_durable.testing.sim_ops import OPEN_BUG_TARGETS, _OperatorCall
from celery_durable.testing.sim_store import OPEN_BUGS, replay_command

ENABLED = tuple(b for b in KNOWN_BUGS if b not in OPEN_BUGS)
PARENTS = ("w_parent", "w_generations")  # the workload's workflows that start children


def _targets(sim: Sim) -> set[str]:
    kind = {p.eid: p.workflow for p in sim.plan}
    return {kind[op.eid] for _, _, op in sim.ops if isinstance(op, _OperatorCall)}


def test_no_operator_call_targets_a_parent_or_a_saga_while_the_trigger_is_off() -> None:
    assert set(PARENTS) <= set(OPEN_BUG_TARGETS)
    for seed in range(400):
        for cls in (Sim, ForgingSim):
            hit = _targets(cls(seed, Faults(), ENABLED)) & set(OPEN_BUG_TARGETS)
            assert not hit, f"{cls.__name__} seed {seed} plans operator calls on {hit}"


def test_the_trigger_still_puts_parents_under_operator_calls() -> None:
    with_bug = (*ENABLED, "operator_compensations")
    hit: set[str] = set()
    for seed in range(200):
        hit |= _targets(Sim(seed, Faults(), with_bug))
    assert set(PARENTS) <= hit


def test_forge_seed_137_passes() -> None:
    """Failed before: invariant 1 on s137-8-w_generations (a resume of its cancelled child step)."""
    result = run_forged_seed(137, Faults(), known_bugs=ENABLED)
    assert not result.violations, f"{result.violations[0]} (ForgingSim; {replay_command(137, Faults(), ENABLED)})"
