"""The host side of `SharedFS.apply`: small writes (and reads) on the shared FS run in order in one
process, stopping at the first that fails. Each op does what the single operation of the same name
does (ablate/transport/base.py; the bash scripts of ablate/transport/sshfs.py), with the same
atomicity: a temp file beside the target, fsync'd, then rename (`write_atomic`) or link(), which
never replaces a name (`create_immutable`, mode 0444, checked by sha256).

Stdlib only, self-contained (no other ablate module): the probe runs it (`probe apply`, the ops as
JSON on stdin), and the ssh transport runs this file's source alone (`python -c`) to ship the probe.
Input: {"ops": [{"op": "create_immutable", "path", "data": base64, "sha256"},
{"op": "write_atomic", "path", "data": base64, "mode": int}, {"op": "append_line", "path", "line"},
{"op": "remove", "path"}, {"op": "read", "path"}]}. Answer: {"results": one per op done (create and
remove: true/false, read: base64 or null, else null), "failed": null or {"index", "reason"}}.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sys

TYPE_CHECKING = False  # not `typing`'s: importing typing costs every probe start ~6 ms

if TYPE_CHECKING:
    from typing import Any

# The reason a create_immutable gives for a name taken by other bytes (as the ssh script's exit 4).
CONFLICT = "it exists with other content; an immutable file is never overwritten"


class Refused(Exception):
    """An op refused for a reason of its own (not an OSError): its message is the reason."""


def reason(e: OSError, path: str) -> str:
    """`[Errno 20] Not a directory`, with the file it concerns when that is not `path` itself."""
    if e.errno is None:
        return str(e) or type(e).__name__
    other = [str(f) for f in (e.filename, e.filename2)
             if f is not None and os.path.normpath(str(f)) != os.path.normpath(path)]
    why = f"[Errno {e.errno}] {e.strerror or os.strerror(e.errno)}"
    return why + (": " + ", ".join(repr(f) for f in other) if other else "")


def _temp_copy(path: str, data: bytes, mode: int) -> str:
    """`data` in an fsync'd temp file beside `path` with `mode` (removed again when that fails)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    import tempfile  # only writes need it: ~10 ms of imports off every probe start

    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _same(path: str, sha256: str) -> bool:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() == sha256
    except OSError:  # a directory, unreadable: not the same file (as `sha256sum <` says there)
        return False


def write_atomic(path: str, data: bytes, mode: int) -> None:
    tmp = _temp_copy(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def create_immutable(path: str, data: bytes, sha256: str) -> bool:
    """True when created; False when the same bytes are there. link() fails when the name exists,
    so two deployers racing never overwrite each other."""
    if os.path.exists(path):
        if _same(path, sha256):
            return False
        raise Refused(CONFLICT)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise Refused("the bytes arrived damaged (sha256 differs from the controller's)")
    tmp = _temp_copy(path, data, 0o444)
    try:
        if not _same(tmp, sha256):
            raise Refused(f"the temp copy {tmp} does not read back as written")
        try:
            os.link(tmp, path)
        except FileExistsError:
            if _same(path, sha256):
                return False
            raise Refused(CONFLICT) from None
        return True
    finally:
        _unlink(tmp)


def append_line(path: str, line: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    # O_APPEND writes of one short line are atomic with respect to other appenders.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode())
    finally:
        os.close(fd)


def remove(path: str) -> bool:
    try:
        os.unlink(path)  # a directory raises (EISDIR): never removed
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return base64.b64encode(f.read()).decode()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _one(op: dict[str, Any]) -> Any:
    kind, path = op["op"], op["path"]
    if kind == "create_immutable":
        return create_immutable(path, base64.b64decode(op["data"]), op["sha256"])
    if kind == "write_atomic":
        return write_atomic(path, base64.b64decode(op["data"]), int(op["mode"]))
    if kind == "append_line":
        return append_line(path, op["line"])
    if kind == "remove":
        return remove(path)
    if kind == "read":
        return read(path)
    raise ValueError(f"unknown op {kind!r}")


def apply(args: dict[str, Any]) -> dict[str, Any]:
    """Run args["ops"] in order; stop at the first that fails (the ones before it took effect)."""
    results: list[Any] = []
    for i, op in enumerate(args["ops"]):
        try:
            results.append(_one(op))
        except OSError as e:
            return {"results": results, "failed": {"index": i, "reason": reason(e, op["path"])}}
        except Refused as e:
            return {"results": results, "failed": {"index": i, "reason": str(e)}}
    return {"results": results, "failed": None}


if __name__ == "__main__":  # `python -c <this file>`: the ops on stdin (shipping the probe)
    print(json.dumps(apply(json.load(sys.stdin))))
