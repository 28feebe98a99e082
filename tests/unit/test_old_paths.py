"""Code written against the module paths before the restructuring (issue 24) keeps working.

``old_module_names.json`` lists every module of the package at 3be121c (the commit before the
restructuring) with the names of its ``__all__`` (or, without one, its public functions and
classes). Each must still be found at its old path, the same object as at its new one, with a
DeprecationWarning; a name that was split into others says so instead (celery_durable/_moved.py).
"""

from __future__ import annotations

import importlib
import json
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest
from kombu.utils.imports import symbol_by_name

from celery_durable._moved import MOVED, NAMES

OLD_NAMES: dict[str, list[str]] = json.loads((Path(__file__).parent / "old_module_names.json").read_text())

#: packages that replaced a module of the same name and hand its names on
REPLACING_PACKAGES = [
    "celery_durable.activity",  # a module still, the API inside activities now
    "celery_durable.cli",
    "celery_durable.stores.sqlite",
    "celery_durable.stores.postgres",
    "celery_durable.stores.cosmos",
    "celery_durable.stores.push",
    "celery_durable.stores.offload",
    "celery_durable.engine.replay",
    "celery_durable.engine.admin",
]


def _quietly(module: str) -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(module)


def test_old_module_paths_still_import_the_same_module() -> None:
    """Every moved module path imports with a warning: the module itself, or (where names moved
    elsewhere) a stand-in whose names are the same objects."""
    assert len(MOVED) >= 70
    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
            module = importlib.import_module(old)
        target = importlib.import_module(new)
        if old not in NAMES:
            assert module is target, old
        else:
            for name in getattr(target, "__all__", ()):
                assert getattr(module, name) is getattr(target, name), (old, name)


@pytest.mark.parametrize("module", sorted(OLD_NAMES))
def test_every_name_of_an_old_module_is_found_at_its_old_path(module: str) -> None:
    old = _quietly(module)
    gone = {n: why for n, why in NAMES.get(module, {}).items() if ":" not in why}
    for name in OLD_NAMES[module]:
        if name in gone:
            with pytest.raises(AttributeError, match=f"{name} is gone: it was split into"):
                getattr(old, name)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert hasattr(old, name), f"from {module} import {name} no longer works"


def test_a_renamed_name_is_the_new_object_with_a_warning() -> None:
    from celery_durable.engine.documents.checks import check_shape
    from celery_durable.engine.signals.inbox import declared_signals
    from celery_durable.stores.base import encode_doc

    links = _quietly("celery_durable.engine.links")
    with pytest.warns(DeprecationWarning, match="declared_signals moved to celery_durable.engine.signals.inbox"):
        assert links.declared_signals is declared_signals
    with pytest.warns(DeprecationWarning):
        assert _quietly("celery_durable.engine.checks").check_doc is check_shape
    with pytest.warns(DeprecationWarning, match="check_doc is encode_doc now"):
        assert _quietly("celery_durable.stores.base").check_doc is encode_doc
    with pytest.raises(AttributeError):
        _quietly("celery_durable.stores.base").no_such_name  # noqa: B018 - the access is the test


def test_the_old_hooks_receivers_module_imports() -> None:
    """``celery_durable/signals/`` was a package with ``receivers.py``; ``signals.py`` keeps a path."""
    sys.modules.pop("celery_durable.signals.receivers", None)
    with pytest.warns(DeprecationWarning, match="moved to celery_durable.glue.hook_receivers"):
        module = importlib.import_module("celery_durable.signals.receivers")
    assert module is importlib.import_module("celery_durable.glue.hook_receivers")


@pytest.mark.parametrize("package", REPLACING_PACKAGES)
def test_a_star_import_of_a_replaced_module_binds_its_names(package: str) -> None:
    namespace: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exec(f"from {package} import *", namespace)  # noqa: S102 - the star import is the test
    assert set(OLD_NAMES[package]) <= set(namespace), set(OLD_NAMES[package]) - set(namespace)


def test_packages_hand_on_the_names_of_the_modules_they_replaced() -> None:
    """``celery_durable.stores.sqlite`` was a module: ``SqliteStore`` and the others are still found
    there (also by the ``module:name`` strings of Celery and of ``register_backend``)."""
    for name in REPLACING_PACKAGES:
        package = importlib.import_module(name)
        assert package.OLD_NAMES, name
        for old in package.OLD_NAMES:
            with pytest.warns(DeprecationWarning, match="moved to"):
                getattr(package, old)
        with pytest.raises(AttributeError):
            package.no_such_name  # noqa: B018 - the attribute access is the test
    with pytest.warns(DeprecationWarning):
        assert symbol_by_name("celery_durable.cli:durable") is symbol_by_name("celery_durable.cli.commands:durable")
    with pytest.warns(DeprecationWarning):
        assert symbol_by_name("celery_durable.stores.sqlite:SqliteStore").__name__ == "SqliteStore"
    sys.modules.pop("celery_durable.bootsteps", None)  # an earlier test may have imported the old path
    with pytest.warns(DeprecationWarning):
        step = symbol_by_name("celery_durable.bootsteps:DurableStep")
    assert step is symbol_by_name("celery_durable.glue.bootsteps:DurableStep")
