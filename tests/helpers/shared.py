"""What a test run makes once and every pytest-xdist worker reads: an expensive, read-only tree;
and what is made once per installation (kept across runs and clones in the user's cache directory)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from filelock import FileLock

SUMS = "SHA256SUMS.json"  # beside a kept tree: every file's digest, read back before each use
STALE_DAYS = 30  # a kept tree of another key not used for this long is removed


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


def install_key(dists: Iterable[str], sources: Iterable[Path]) -> str:
    """What a kept tree was made by: this Python, the installed versions of `dists` (absent ones
    too) and the bytes of `sources` (the code that writes it). Any change makes another key."""
    h = hashlib.sha256(f"{sys.version}\n{platform.machine()}\n".encode())
    for dist in sorted(dists):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "absent"
        h.update(f"{dist}=={version}\n".encode())
    for src in sources:
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def _digests(tree: Path) -> dict[str, str]:
    return {p.relative_to(tree).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file() and p.name != SUMS}


def _intact(tree: Path) -> bool:
    """The kept tree holds exactly the files, byte for byte, that it held when it was made."""
    try:
        return bool(json.loads((tree / SUMS).read_text()) == _digests(tree))
    except (OSError, ValueError):
        return False


def keep_dir(name: str) -> Path | None:
    """`$XDG_CACHE_HOME/ablate-tests/<name>/` (`~/.cache` by default), made if need be; None where it
    cannot be (no home, a read-only one)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ablate-tests" / name
    try:
        base.mkdir(parents=True, exist_ok=True)
        return base if os.access(base, os.W_OK) else None
    except (OSError, RuntimeError):
        return None


def once_per_install(name: str, key: str, make: Callable[[Path], None], out: Path) -> None:
    """Fill `out` with the tree `make(dir)` writes, kept across runs in `keep_dir(name)/<key>/`:
    made the first time any run, of any clone, asks for that key (see `install_key`: the installed
    libraries that write it and the writer's code), copied by later runs as long as every file in
    it is as it was made (else made again). Where nothing can be kept, `make(out)` every time."""
    base = keep_dir(name)
    if base is None:
        make(out)
        return
    tree = base / key
    with FileLock(str(base / f"{key}.lock")):
        if not _intact(tree):
            tmp = base / f"{key}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            try:
                make(tmp)
                (tmp / SUMS).write_text(json.dumps(_digests(tmp)))
                shutil.rmtree(tree, ignore_errors=True)
                tmp.rename(tree)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(tree, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(SUMS))
        os.utime(tree)
    cutoff = time.time() - STALE_DAYS * 86400
    for old in base.iterdir():  # trees of versions no longer installed (a "." marks a tree being made)
        if old.is_dir() and old.name != key and "." not in old.name and old.stat().st_mtime < cutoff:
            shutil.rmtree(old, ignore_errors=True)
