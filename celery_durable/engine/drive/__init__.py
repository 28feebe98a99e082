"""Driving an execution: replay it, then commit what replay decided in one batch (``driver``).
``partition_cache`` saves re-reading what this process already saw, ``upkeep`` wakes an execution,
clears a step's due time and prunes a finished run, ``recovery`` is beat's scan for what was lost,
``seals`` marks what a message may carry only if the library wrote it, and ``in_process`` runs an
engine's work without a broker (tests, benchmarks, ``WorkflowEnvironment``).
"""
