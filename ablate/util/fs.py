"""Atomic writes for files on a filesystem this process can reach directly."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ablate.errors import AblateError

__all__ = ["atomic_write", "create_immutable", "read_json_object"]


def _temp_copy(path: Path, data: bytes, mode: int) -> Path:
    """`data` in a synced temp file beside `path` with `mode`: the first half of every publish."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """temp file in the same directory, fsync, chmod, rename over `path`."""
    tmp = _temp_copy(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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
    tmp = _temp_copy(path, data, 0o444)
    try:
        # link() fails if the name exists: two deployers racing cannot overwrite each other.
        try:
            os.link(tmp, path)
        except FileExistsError:
            if _read(path) != data:
                raise AblateError(f"{path} appeared with other content while deploying") from None
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def read_json_object(raw: bytes | None) -> dict[str, Any] | None:
    """A JSON object from a file's bytes; None when absent, torn or not an object."""
    if not raw:
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
