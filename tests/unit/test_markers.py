"""The markers tests/conftest.py gives by place name tests that exist, and tests live by subject."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SLOW_FILES, SLOW_PLACES, SLOW_TESTS, marks_for

TESTS = Path(__file__).resolve().parents[1]


def test_every_slow_file_and_test_named_exists() -> None:
    missing = [f for f in SLOW_FILES if not (TESTS / f).is_file()]
    missing += [p for p in SLOW_PLACES if not (TESTS / p).exists()]
    for entry in SLOW_TESTS:
        path, _, name = entry.partition("::")
        if not (TESTS / path).is_file() or f"def {name}(" not in (TESTS / path).read_text():
            missing.append(entry)
    assert not missing, f"named in tests/conftest.py but not found (moved or renamed?): {missing}"


def test_tests_live_by_subject_with_kinds_as_markers() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    assert not folders & {"adversarial", "regression", "regressions"}, folders
    assert marks_for(Path("engine/test_sticky_breaks.py"), "t", set(), "") == {"adversarial"}
    assert marks_for(Path("engine/test_regressions_ids.py"), "t", set(), "") == {"regression"}
    assert "slow" in marks_for(Path("stores/test_contract.py"), "t", {"cosmos_url"}, "cosmos")
