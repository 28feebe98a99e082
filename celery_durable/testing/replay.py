"""``celery_durable.testing.replay``: Temporal's ``Replayer`` for pytest — replay recorded histories
against the workflow code imported in the test, and fail when the code no longer fits them.

Histories come from ``durable export ID -o file.json`` (kept with the tests), or straight from a
live store (a staging copy, say): every execution of ``workflow`` with ``status``::

    from celery_durable.testing import replay

    def test_the_new_code_replays_production_histories():
        replay(durable, Path("tests/histories").glob("*.json"))   # raises ReplayMismatch

    def test_running_executions_survive_the_deploy():
        replay(durable, status="running")                          # the store durable is configured with
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from celery_durable.engine.replay.check import ReplayVerdict, Verdict, check_all

__all__ = ["replay", "ReplayMismatch", "ReplayVerdict", "Verdict"]


class ReplayMismatch(AssertionError):
    """Some histories do not replay on the code under test; ``verdicts`` holds every verdict."""

    def __init__(self, verdicts: list[ReplayVerdict]) -> None:
        self.verdicts = verdicts
        bad = [v for v in verdicts if not v.ok]
        lines = [f"{v.execution_id} ({v.workflow}, {v.status}): {v.verdict}: {v.hint or v.detail}" for v in bad]
        super().__init__(f"{len(bad)} of {len(verdicts)} histories do not replay:\n" + "\n".join(lines))


def replay(
    durable: Any,
    histories: Iterable[str | Path | Mapping[str, Any]] | str | Path | Mapping[str, Any] | None = None,
    *,
    workflow: str | None = None,
    status: str | None = "running",
    limit: int = 1000,
    raise_on_mismatch: bool = True,
) -> list[ReplayVerdict]:
    """Replay each history read-only against ``durable``'s registered workflows (nothing is
    written or sent); the verdicts, in order. ``histories``: exported histories (paths or their
    parsed JSON; one, or several: none at all is a ValueError); ``None``: the executions of
    ``durable``'s store (``workflow``, ``status`` — ``None`` for any — at most ``limit``). Raises
    :class:`ReplayMismatch` when any is not compatible, unless ``raise_on_mismatch=False``."""
    if isinstance(histories, str | Path | Mapping):  # one history, not an iterable of its characters
        histories = [histories]
    given = None if histories is None else list(histories)
    if given is not None and not given:  # an empty glob (a typo in its path) must not pass
        raise ValueError("no history to check: the histories given are empty")
    found = list(check_all(durable.engine, given, workflow, status, limit))
    if raise_on_mismatch and any(not v.ok for v in found):
        raise ReplayMismatch(found)
    return found
