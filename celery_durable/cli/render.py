"""Terminal output of the ``durable`` CLI (also used by ``example_project`` and the benchmarks).

Tables are `rich <https://rich.readthedocs.io>`_ tables: columns sized by rich, never by hand.
Every cell goes through :func:`cell`, so a value with a newline or another control character
(an execution id is any string) is shown escaped, on its own row, and ``[bold]`` in an id is
text, not markup. On a terminal the table fits its width (long cells fold) and the purge shows a
progress bar; piped, nothing wraps and there are no colours or control sequences, so scripts and
``grep`` see one row per line.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from celery_durable.engine.admin.wording import escape

__all__ = ["is_terminal", "console", "cell", "table", "print_table", "progress"]

#: width of a console that is not a terminal: wide enough that no table ever wraps
_PIPE_WIDTH = 100_000


def is_terminal(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (stdout) is an interactive terminal (tests patch this)."""
    stream = sys.stdout if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or exotic stream
        return False


def console(stream: IO[str] | None = None) -> Console:
    """A console on ``stream`` (default: the current ``sys.stdout``, so click's runner sees it)."""
    stream = sys.stdout if stream is None else stream
    if is_terminal(stream):
        return Console(file=stream, force_terminal=True, highlight=False, markup=False, emoji=False)
    # piped: plain text, never wrapped, never cropped
    return Console(
        file=stream,
        width=_PIPE_WIDTH,
        color_system=None,
        force_terminal=False,
        highlight=False,
        markup=False,
        emoji=False,
    )


def cell(value: Any) -> Text:
    """One table cell: ``None`` as ``-``, control characters escaped, no markup interpreted."""
    return Text(escape("-" if value is None else str(value)))


def table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None, right: Sequence[int] = ()
) -> Table:
    """A borderless table: a header, a rule, one line per row (columns ``right`` right-aligned)."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title=title, title_justify="left")
    for i, header in enumerate(headers):
        t.add_column(header, justify="right" if i in right else "left", overflow="fold")
    for row in rows:
        t.add_row(*(value if isinstance(value, Text) else cell(value) for value in row))
    return t


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    title: str | None = None,
    right: Sequence[int] = (),
    stream: IO[str] | None = None,
) -> None:
    """Print :func:`table` on ``stream`` (default stdout)."""
    console(stream).print(table(headers, rows, title=title, right=right))


@contextmanager
def progress(label: str, total: int, stream: IO[str] | None = None, quiet: bool = False) -> Iterator[Any]:
    """A progress bar on a terminal; yields ``update(done)`` (a no-op when not a terminal, or
    ``quiet``: stdout is a JSON document)."""
    if quiet or not is_terminal(stream):
        yield lambda done: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console(stream)) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)
