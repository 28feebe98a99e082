"""mkdocs hook: the settings reference, generated from ``celery_durable.settings.Settings``.

``reference/settings.md`` holds the marker ``<!-- settings-table -->``; at build time it becomes a
table with one row per field of the ``Settings`` dataclass: its Celery key, its type, its default
and its description, which is the field's ``#:`` comment in the source. So the table cannot drift
from the code: a new setting appears once it is declared, and a setting without a description
fails the build.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import sys
import textwrap
from pathlib import Path
from typing import Any
from unittest import mock

MARKER = "<!-- settings-table -->"
PAGE = "reference/settings.md"


def _settings_class() -> Any:
    try:
        from celery_durable.settings import Settings
    except ImportError:  # building from a checkout that is not installed
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from celery_durable.settings import Settings
    return Settings


def _descriptions(cls: type) -> dict[str, str]:
    """Each field's ``#:`` comment (the lines right above it), joined into one line."""
    lines, _ = inspect.getsourcelines(cls)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    klass = tree.body[0]
    assert isinstance(klass, ast.ClassDef)
    docs: dict[str, str] = {}
    for node in klass.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        i = node.lineno - 2  # the line above, 0-based
        while i >= 0 and lines[i].strip().startswith("#:"):
            comment.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        docs[node.target.id] = " ".join(comment)
    return docs


def _seconds(value: float) -> str:
    text = f"{value:,.0f}" if value == int(value) else f"{value:g}"
    days = value / 86400
    return f"{text} s ({days:g} days)" if value >= 86400 and days == int(days) else f"{text} s"


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default_factory is not dataclasses.MISSING:
        with mock.patch.dict(os.environ, clear=True):  # the default, not this machine's environment
            value = f.default_factory()
    else:
        value = f.default
    if isinstance(value, bool) or value is None:
        return f"`{value}`"
    if f.type == "float":
        return _seconds(float(value))
    if isinstance(value, int):
        return f"{value:,}"
    return f'`"{value}"`' if isinstance(value, str) else f"`{value}`"


def _type(f: dataclasses.Field[Any]) -> str:
    kind = str(f.type)
    return "`float` (seconds) or `timedelta`" if kind == "float" else f"`{kind}`"


def _cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def settings_table() -> str:
    cls = _settings_class()
    docs = _descriptions(cls)
    rows = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        description = docs.get(f.name, "")
        if not description:
            raise ValueError(f"Settings.{f.name} has no '#:' comment: document it in the Settings class")
        rows.append(f"| `durable_{f.name}` | {_type(f)} | {_default(f)} | {_cell(description)} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its {MARKER} marker")
    return markdown.replace(MARKER, settings_table())
