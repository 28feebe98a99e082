"""Permissions of the SQLite store's files (:mod:`celery_durable.stores.sqlite.store`).

SQLite creates a database file 0644 (less the umask) and gives its ``-wal``/``-shm`` files the
mode of the database file. The documents may hold personal data or secrets, so the store creates
a missing file itself, 0600 unless ``file_mode`` says otherwise; an existing file keeps its mode.
"""

from __future__ import annotations

import os
from typing import Any

from celery_durable.errors import ConfigurationError

__all__ = ["DEFAULT_FILE_MODE", "check_file_mode", "create_file"]

#: permissions of a store file the store creates (its -wal/-shm files get the same)
DEFAULT_FILE_MODE = 0o600


def check_file_mode(mode: Any) -> int:
    """``file_mode`` as an int: an int, or octal text (``"0640"``, ``"640"``, ``"0o640"``)."""
    value = mode
    if isinstance(mode, str):
        text = mode.strip().lower().removeprefix("0o")
        value = int(text, 8) if text and set(text) <= set("01234567") else None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise ConfigurationError(f"file_mode must be permission bits like 0600 or 0640, got {mode!r}")
    if value & 0o600 != 0o600:
        raise ConfigurationError(f"file_mode {value:#o} must let the owner read and write (0600)")
    return value


def create_file(path: str, mode: int) -> None:
    """Create ``path`` with exactly ``mode`` if it does not exist; leave an existing file alone.

    ``O_EXCL``: of processes opening a new store at once, one creates the file; ``fchmod``: the
    mode asked for, whatever the umask.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError:  # it exists, or e.g. its directory does not: sqlite3.connect reports that
        return
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
