"""The documentation site builds with ``mkdocs build --strict`` (broken links and anchors, pages
left out of the nav and a settings table that cannot be generated all fail it), and the README
stays a short front page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    settings = (site / "reference" / "settings" / "index.html").read_text()
    assert "durable_store_url" in settings and "durable_result_push_recheck" in settings
    assert "settings-table" not in settings  # the marker was replaced by the generated table


def test_every_setting_is_in_the_generated_reference() -> None:
    """The table comes from the Settings dataclass: one row per field, each with a description."""
    from dataclasses import fields

    from celery_durable.settings import Settings

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import settings_reference
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    table = settings_reference.settings_table().splitlines()
    assert len(table) == 2 + len(fields(Settings))
    for f in fields(Settings):
        row = next(line for line in table if line.startswith(f"| `durable_{f.name}` |"))
        assert row.rstrip(" |").split("|")[-1].strip(), f"durable_{f.name} has no description"
    assert any("| `durable_outbox_retention` |" in r and "(7 days)" in r for r in table)


def test_readme_is_short() -> None:
    assert (ROOT / "README.md").stat().st_size <= 20_000
