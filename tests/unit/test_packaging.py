"""What an editable install (the README's `pip install -e .`) gives the user's tools (issue 25).

setuptools made it an import hook (the packages sit at the repository root beside others), which
mypy and pyright do not follow: "Cannot find implementation or library stub for module named
'celery_durable'". A `.pth` naming the root is what they read."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _installed() -> importlib.metadata.Distribution | None:
    """The installed distribution that pip recorded as editable (an egg-info at the root, which
    the root on sys.path also shows, is not an install)."""
    for dist in importlib.metadata.distributions(name="celery-durable"):
        info = json.loads(dist.read_text("direct_url.json") or "{}")
        if info.get("dir_info", {}).get("editable"):
            return dist
    return None


def _editable() -> bool:
    return _installed() is not None


@pytest.mark.skipif(not _editable(), reason="installed from a wheel, not `pip install -e .`")
def test_an_editable_install_is_a_path_mypy_follows() -> None:
    dist = _installed()
    assert dist is not None
    files = [str(f) for f in dist.files or ()]
    assert not [f for f in files if f.endswith("_finder.py")], files  # no import hook
    pth = [f for f in files if f.endswith(".pth")]
    assert pth, files


@pytest.mark.skipif(not _editable(), reason="installed from a wheel, not `pip install -e .`")
def test_mypy_finds_the_package_after_an_editable_install(tmp_path: Path) -> None:
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\nfollow_imports = silent\n[mypy-celery.*,kombu.*]\nignore_missing_imports = True\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "-c", "import celery_durable"],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # away from the repository, as a user's project is
        timeout=300,
    )
    assert "Cannot find implementation" not in out.stdout + out.stderr
    assert out.returncode == 0, out.stdout + out.stderr
