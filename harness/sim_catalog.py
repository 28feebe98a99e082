"""What the deterministic simulation (:mod:`harness.sim`) checks and which engine bugs its workload
triggers: the invariants by number, the known bugs' triggers and which of them are open."""

from __future__ import annotations

__all__ = ["INVARIANTS", "KNOWN_BUGS", "OPEN_BUGS", "parse_known_bugs"]

INVARIANTS = {
    0: "no unexpected exception escapes a worker's handler",
    1: "every execution ends as in a fault-free run (or cancelled, when a cancel was sent)",
    2: "no recorded result/outcome document changes after its first write",
    3: "no cancel is downgraded, no terminal status changes, no exec update is lost (its counters never go back)",
    4: "each step's outcome is recorded once; one worker never runs two attempts of a step at once",
    5: "no execution is left running with nothing due after healing",
    6: "no signal accepted (signal() returned True) is lost",
    7: "a child execution is created only while its parent's run is running",
    8: "an operator's rewrite is all or nothing: a cut history is recorded (pending op) until reopened, "
    "a step it did not record forgetting never runs again, no op is left pending (sim_ops.py)",
    9: "no step is begun or recorded from a forged or stale message (sim_forge.py)",
    10: "of the executions holding a dedup key, at most one is running and not asked to cancel (sim_dedup.py)",
    11: "every deadline that passed is enforced by the next clock scan without faults, never early; a delayed "
    "start takes no step before its time (sim_deadlines.py)",
    12: "a step's recorded heartbeat details never go back (only its attempt holding the lease writes them); "
    "an attempt told to stop has its step settled, its run ended or the step taken by another attempt, or "
    "its workflow waits on it and a cancel was requested after the step was taken (never a compensation)",
    13: "of one limit key, at most max_running attempts hold a live step lease at once, and no slot is freed while "
    "its attempt holds one; no rate is exceeded by attempt begins over any window of its period (less the clocks' "
    "skew); after healing no limit document has waiters while it has room; of the executions under one limit key, "
    "at most max_running are running at every store state, each holding a slot; after healing none is left "
    "queued while it could start, and every one has ended (sim_limits.py, sim_wf_limits.py)",
    14: "no step marker of its current run is created, and no attempt of a step created while paused begins, while "
    "an execution's exec as last written says paused; only an unpause clears it; none is left paused (sim_pause.py)",
    15: "an update request a client sent is never lost: it ends accepted, rejected, or refused as its execution "
    "ended; an accepted one is a step of its run, applied once (its answer is what the history's replay gives), "
    "a rejected one is in no history, and only the invalid are rejected (sim_updates.py)",
    16: "a batch acts at most once on an execution, only on what its query selects, on every one its query selected "
    "until it acted or ended; it finishes, its counts agree with its records (sim_batch.py)",
}

#: Workload triggers of engine bugs (each description is the bug it found). All are fixed and on
#: by default (``--known-bugs all``); a trigger whose bug reopens goes into ``OPEN_BUGS`` in
#: ``tests/sim/test_sim.py`` (run there only by an xfail test) until its fix lands.
KNOWN_BUGS = {
    "child_after_continue": "issue 10 bug 4: child ids collide across continue-as-new runs "
    "(workload w_generations: run 1 waits forever for run 0's child)",
    "same_process_duplicate": "issue 10 bug 6: a duplicate activity delivery to the worker already running it "
    "runs a second attempt at once (the lease holder is the process, not the attempt)",
    "cancel_parent": "issue 10 bug 8: a cancelled parent's never-created child is created later by recovery "
    "(workload: parents are cancelled)",
    "signal_vs_continue": "issue 10 bug 7: a signal racing continue-as-new is accepted and lost "
    "(workload: signal workflows continue as new between waits)",
    "stale_run_release": "a late completion of an old run's activity (lease lapsed, the run continued as new) "
    "releases the *current* run's marker with the same seq (the driver keys release by the exec's run), "
    "so a lost message of the current activity is never re-sent: stranded "
    "(workload: continue-as-new workflows run an activity in each run; the same holds for a timer)",
    "signal_timeout_race": "a signal accepted (True) while the wait's timeout is being fired is lost: fire_clock "
    "read the partition before the value and records the timeout anyway (seen on the working tree's new "
    "signal-value code; the workload's signal timeouts then fire during the fault phase)",
    "record_before_claim": "a contended drive records its carried outcome and releases the step's marker "
    "*before* claiming the exec lease; a store error or crash in between leaves the outcome recorded, the marker "
    "settled and the exec not due, and recovery's activity scan then settles the marker without a drive: "
    "stranded. Not a trigger but a signature: a stranded execution with an outcome written after its exec's "
    "last write is reported as tolerated (not a violation) unless this is on",
    "operator_compensations": "issue 23: operator calls on sagas and parents (sim_ops.py). Resume of a "
    "cancelled parent whose child had not honoured the cancel yet ended it failed (ChildWorkflowError), as did "
    "a child's cancelled end recorded after (or racing) the resume; a reset of a cancelled saga to a step after "
    "the cancel point kept the compensations it recorded (non-deterministic re-run); a fence's step stayed "
    "pending with nothing due (fixed: admin.cascaded, rearm_waiting_children, kin.withdrawn_cancels, "
    "stale_child_outcomes, reset refuses a step inside the compensations)",
    "signal_error_after_write": "signal() whose write applied but raised (or a client dying before wake()) "
    "leaves the signal recorded and the execution never driven; fire_clock then clears the wait's timeout "
    "without a drive, so it is stranded",
}

#: triggers whose bug is open: off in the main test and the bench's default (``--known-bugs fixed``)
OPEN_BUGS: tuple[str, ...] = ()


def parse_known_bugs(spec: str) -> list[str]:
    """``all`` (every trigger in :data:`KNOWN_BUGS`), ``none`` or a comma list of their names."""
    if spec == "all":
        return list(KNOWN_BUGS)
    bugs = [] if spec in ("", "none") else spec.split(",")
    unknown = [b for b in bugs if b not in KNOWN_BUGS]
    if unknown:
        raise ValueError(f"unknown known-bug triggers {unknown}; known: {', '.join(KNOWN_BUGS)}")
    return bugs
