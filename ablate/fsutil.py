"""Atomic writes for files on a filesystem this process can reach directly."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ablate.errors import AblateError


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """temp file in the same directory, fsync, chmod, rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def create_immutable(path: Path, data: bytes) -> bool:
    """Create `path` (mode 0444) with `data` unless it exists. Never writes over a file.

    Returns True when created, False when an identical file was already there.
    """
    existing = _read(path)
    if existing is not None:
        if existing != data:
            raise AblateError(f"{path} exists with other content; refusing to overwrite an immutable file")
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o444)
        # link() fails if the name exists: two deployers racing cannot overwrite each other.
        try:
            os.link(tmp, path)
        except FileExistsError:
            if _read(path) != data:
                raise AblateError(f"{path} appeared with other content while deploying") from None
            return False
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def sha256_file(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()
