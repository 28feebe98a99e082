"""Old module paths of the restructuring (issue 24) still import, with a DeprecationWarning.

Modules moved into rooms (``celery_durable.wire`` is ``celery_durable.glue.wire``
now, ``celery_durable.engine.local`` is ``celery_durable.engine.drive.in_process`` ...). Code
written against the old paths (a user's import of an internal module, a bootstep's ``requires``
string, a script) keeps working: a finder on ``sys.meta_path`` answers an old name with the
module that now holds it, the same object. Where an old module became a package of the same name
(``celery_durable.stores.sqlite``), the package hands on the old module's names itself
(:func:`moved_attr`). Nothing here imports a module of the package until an old name is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "install", "moved_attr"]

#: old module -> the module that holds it now
MOVED: dict[str, str] = {
    "celery_durable.beat_shutdown": "celery_durable.glue.beat_shutdown",
    "celery_durable.bootsteps": "celery_durable.glue.bootsteps",
    "celery_durable.cli_cosmos": "celery_durable.cli.cosmos",
    "celery_durable.cli_ops": "celery_durable.cli.operator_actions",
    "celery_durable.cli_render": "celery_durable.cli.render",
    "celery_durable.consistency": "celery_durable.glue.session_tokens",
    "celery_durable.eager_activities": "celery_durable.glue.eager_activities",
    "celery_durable.engine.activity": "celery_durable.engine.activities.attempts",
    "celery_durable.engine.cache": "celery_durable.engine.drive.partition_cache",
    "celery_durable.engine.cancel_withdrawal": "celery_durable.engine.admin.cancel_withdrawal",
    "celery_durable.engine.channels": "celery_durable.engine.signals.channels",
    "celery_durable.engine.checks": "celery_durable.engine.documents.checks",
    "celery_durable.engine.child_ops": "celery_durable.engine.admin.child_ops",
    "celery_durable.engine.context": "celery_durable.engine.replay.context",
    "celery_durable.engine.decoded": "celery_durable.engine.replay.decoded",
    "celery_durable.engine.delivery": "celery_durable.engine.activities.delivery",
    "celery_durable.engine.driver": "celery_durable.engine.drive.driver",
    "celery_durable.engine.heartbeat": "celery_durable.engine.activities.lease_heartbeat",
    "celery_durable.engine.kin": "celery_durable.engine.children.holders",
    "celery_durable.engine.leases": "celery_durable.engine.activities.leases",
    "celery_durable.engine.links": "celery_durable.engine.children.links",
    "celery_durable.engine.local": "celery_durable.engine.drive.in_process",
    "celery_durable.engine.local_steps": "celery_durable.engine.activities.local_activities",
    "celery_durable.engine.model": "celery_durable.engine.documents.model",
    "celery_durable.engine.oplog": "celery_durable.engine.admin.oplog",
    "celery_durable.engine.parts": "celery_durable.engine.ports",
    "celery_durable.engine.pending_ops": "celery_durable.engine.admin.pending_ops",
    "celery_durable.engine.purging": "celery_durable.engine.admin.purge",
    "celery_durable.engine.queries": "celery_durable.engine.replay.queries",
    "celery_durable.engine.recovery": "celery_durable.engine.drive.recovery",
    "celery_durable.engine.reruns": "celery_durable.engine.admin.reruns",
    "celery_durable.engine.reset": "celery_durable.engine.admin.reset",
    "celery_durable.engine.salvage": "celery_durable.engine.admin.undecodable",
    "celery_durable.engine.schema": "celery_durable.engine.documents.schema",
    "celery_durable.engine.seals": "celery_durable.engine.drive.seals",
    "celery_durable.engine.search": "celery_durable.engine.documents.search",
    "celery_durable.engine.sends": "celery_durable.engine.signals.external",
    "celery_durable.engine.sticky": "celery_durable.engine.replay.sticky",
    "celery_durable.engine.superseded": "celery_durable.engine.admin.superseded",
    "celery_durable.engine.timeline": "celery_durable.engine.admin.timeline",
    "celery_durable.engine.versioning": "celery_durable.engine.replay.versioning",
    "celery_durable.extension": "celery_durable.glue.extension",
    "celery_durable.pools": "celery_durable.glue.pools",
    "celery_durable.stores._chunks": "celery_durable.stores.offload.chunks",
    "celery_durable.stores._cosmos_config": "celery_durable.stores.cosmos.config",
    "celery_durable.stores._cosmos_due": "celery_durable.stores.cosmos.due",
    "celery_durable.stores._cosmos_errors": "celery_durable.stores.cosmos.errors",
    "celery_durable.stores._cosmos_index": "celery_durable.stores.cosmos.index",
    "celery_durable.stores._cosmos_list": "celery_durable.stores.cosmos.listing",
    "celery_durable.stores._cosmos_migrate": "celery_durable.stores.cosmos.migrate",
    "celery_durable.stores._cosmos_provision": "celery_durable.stores.cosmos.provision",
    "celery_durable.stores._cosmos_read": "celery_durable.stores.cosmos.read",
    "celery_durable.stores._cosmos_search": "celery_durable.stores.cosmos.search",
    "celery_durable.stores._cosmos_session": "celery_durable.stores.cosmos.session",
    "celery_durable.stores._postgres_conn": "celery_durable.stores.postgres.connection",
    "celery_durable.stores._postgres_push": "celery_durable.stores.push.postgres",
    "celery_durable.stores._redis_push": "celery_durable.stores.push.redis",
    "celery_durable.stores._sql": "celery_durable.stores.sql_rows",
    "celery_durable.stores._sqlite_files": "celery_durable.stores.sqlite.files",
    "celery_durable.stores._sqlite_search": "celery_durable.stores.sqlite.search",
    "celery_durable.stores.chunk_gc": "celery_durable.stores.offload.chunk_gc",
    "celery_durable.stores.notifiers": "celery_durable.stores.push.selection",
    "celery_durable.tasks": "celery_durable.glue.tasks",
    "celery_durable.testing.cosmos_account": "harness.cosmos_account",
    "celery_durable.testing.outbox_sim": "harness.outbox_sim",
    "celery_durable.testing.outbox_sim_forge": "harness.outbox_sim_forge",
    "celery_durable.testing.outbox_sim_parts": "harness.outbox_sim_parts",
    "celery_durable.testing.sim": "harness.sim",
    "celery_durable.testing.sim_checks": "harness.sim_checks",
    "celery_durable.testing.sim_faults": "harness.sim_faults",
    "celery_durable.testing.sim_forge": "harness.sim_forge",
    "celery_durable.testing.sim_ops": "harness.sim_ops",
    "celery_durable.testing.sim_sticky": "harness.sim_sticky",
    "celery_durable.testing.sim_store": "harness.sim_store",
    "celery_durable.testing.sim_workload": "harness.sim_workload",
    "celery_durable.wire": "celery_durable.glue.wire",
    # the Celery-style hooks were a package (signals/, with receivers.py); signals.py has a __path__
    "celery_durable.signals.receivers": "celery_durable.glue.hook_receivers",
}

#: names an old module had that the module now holding it lacks (renamed, or moved to a third
#: module): old module -> {name: "new.module:new_name"}, or a sentence saying what replaced it
NAMES: dict[str, dict[str, str]] = {
    "celery_durable.cli_ops": {"prompt": "celery_durable.engine.admin.wording:prompt"},
    "celery_durable.cli_render": {"ts": "celery_durable.engine.admin.wording:ts"},
    "celery_durable.engine.checks": {"check_doc": "celery_durable.engine.documents.checks:check_shape"},
    "celery_durable.engine.links": {
        "declared_signals": "celery_durable.engine.signals.inbox:declared_signals",
        "Links": "it was split into Timers (celery_durable.engine.timers.clocks), Signals"
        " (celery_durable.engine.signals.inbox) and Children (celery_durable.engine.children.links)",
    },
    "celery_durable.engine.parts": {
        "LinksPort": "it was split into ChildrenPort and SignalsPort (celery_durable.engine.ports)",
    },
    "celery_durable.testing.sim": {"main": "harness.sim_main:main"},
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new}", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        extra = NAMES.get(spec.name)
        return module if extra is None else _shim(spec.name, module, extra)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module is the one the new path imported."""


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


_FINDER = _Finder()


def _shim(old: str, module: ModuleType, extra: dict[str, str]) -> ModuleType:
    """A module standing for ``old``: ``module``'s names (the same objects) and ``extra``'s."""
    shim = ModuleType(old, module.__doc__)
    shim.__all__ = [*getattr(module, "__all__", ()), *(n for n, t in extra.items() if ":" in t)]  # type: ignore[attr-defined]

    def __getattr__(name: str) -> Any:
        target = extra.get(name)
        if target is None:
            return getattr(module, name)
        if ":" not in target:
            raise AttributeError(f"{old}.{name} is gone: {target}")
        new, _, new_name = target.partition(":")
        warnings.warn(f"{old}.{name} moved to {new}.{new_name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), new_name)

    shim.__getattr__ = __getattr__  # type: ignore[method-assign]
    return shim


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``celery_durable/__init__`` calls it)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def moved_attr(package: str, name: str, module: str, names: frozenset[str]) -> Any:
    """A package's ``__getattr__``: ``name`` of the old module the package replaced, from ``module``."""
    if name not in names:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(f"{package}.{name} moved to {module}.{name}", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(module), name)
