"""Proving a simulation harness can fail: the first seed a planted bug is caught on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from harness.sim import Faults, SimResult, run_seed


def first_caught(
    run: Callable[[int], SimResult],
    seeds: Iterable[int],
    invariant: int | None = None,
    known_bugs: Sequence[str] = (),
) -> tuple[int, SimResult] | None:
    """The first of ``seeds`` whose run with the planted bug (``run``) breaks ``invariant`` (any
    invariant when None) and whose clean run (``known_bugs`` enabled) holds every one."""
    for seed in seeds:
        broken = run(seed)
        caught = [v for v in broken.violations if invariant is None or v.invariant == invariant]
        if caught and run_seed(seed, Faults(), known_bugs).ok:
            return seed, broken
    return None
