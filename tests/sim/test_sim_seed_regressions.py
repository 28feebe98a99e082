"""Seeds of the deterministic simulation that once failed, replayed with the same faults and triggers."""

from __future__ import annotations

from harness.sim import Faults, check_seed

#: the triggers ``bench/sim.py`` ran with when the seed failed
BUGS = (
    "child_after_continue,same_process_duplicate,cancel_parent,signal_vs_continue,stale_run_release,"
    "signal_timeout_race,record_before_claim,signal_error_after_write"
).split(",")


def test_seed_401_resume_rearms_a_marker_the_scan_settled_meanwhile() -> None:
    """A resume recorded its re-arm of a cancelled step as a diff of the marker it read (due
    'activity' already: not recorded); the recovery scan, on a view read before the op's first
    batch (the result still there), then settled the marker (due None), and the finisher applied
    the diff on it: the step left with no result and nothing due, the execution running forever."""
    check_seed(401, Faults.parse("all"), BUGS)
