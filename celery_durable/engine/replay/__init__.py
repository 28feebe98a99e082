"""Replay: history in, commands out (docs/architecture.md §6). ``history`` runs a workflow function
against its recorded steps; ``context`` is the workflow's view (``wf.*`` calls land there) and
``futures`` what a durable call returns; ``decoded`` caches decoded results, ``sticky`` keeps a
suspended instance to resume instead of replaying, ``versioning`` is ``wf.patched``, ``queries``
reads a workflow's state without changing it.
"""

from typing import Any

from celery_durable._moved import moved_attr

#: the names of the module this package replaced (issue 24), still found here
OLD_NAMES = frozenset({"Replay", "replay"})
#: a star import binds them as it did
__all__ = sorted(OLD_NAMES)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, "celery_durable.engine.replay.history", OLD_NAMES)
