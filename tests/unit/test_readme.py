"""The code blocks marked ``<!-- runs -->`` in README.md and in every page of the documentation
site (docs/**/*.md) run: each page in its own namespace, its blocks in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"<!-- runs -->\n```python\n(.*?)```", flags=re.S)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def marked_blocks(page: Path) -> list[str]:
    """The blocks of ``page`` marked to run, in order."""
    return MARKED.findall(page.read_text())


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_marked_blocks_run(page: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for block in marked_blocks(page):
        exec(compile(block, str(page), "exec"), namespace)  # noqa: S102 - our own documentation


def test_the_examples_kept_running() -> None:
    """Moving the README into the site kept its examples marked (a lost marker would pass quietly)."""
    counts = {str(p.relative_to(ROOT)): len(marked_blocks(p)) for p in PAGES}
    assert sum(counts.values()) >= 10, counts
    for page in (
        "docs/guides/timers-signals-children.md",
        "docs/guides/channels-local-activities-reset.md",
        "docs/guides/testing.md",
        "docs/guides/queries-status-versioning.md",
        "docs/guides/search-and-memo.md",
        "docs/guides/django.md",
    ):
        assert counts.get(page), f"{page} has no block marked <!-- runs -->"
