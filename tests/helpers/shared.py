"""What a test run makes once and every pytest-xdist worker reads: an expensive, read-only tree."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory this run's workers share: pytest's base temp directory, or under xdist the one
    that holds every worker's (`.../pytest-N/`, the parent of `.../pytest-N/popen-gwK/`)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """`<run root>/<name>/`, made by `make(dir)` in the first process of this run that asks (the
    others wait for it on a file lock, then read what it made). A `make` that raised leaves nothing
    behind: the next process to ask makes it again (and fails the same way, in its own test)."""
    root = run_root(tmp_path_factory)
    out, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            make(out)
            done.touch()
    return out
