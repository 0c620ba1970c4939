"""What a cell's checkpoint is, as ablate.yaml names it and MANIFEST.json records it. Stdlib only.

Shipped to instances with the probe (`ablate/remote/`), so verify on an instance and on the laptop
read a configuration and a manifest the same way.

`artifacts.checkpoint` is one entry or a list of them; each entry is a path relative to the cell's
`{ckpt_dir}`: a file, a directory (every file under it), or a glob of `* ? [...]` (bash's pathname
expansion, one path segment per `*`) matching files or directories. `artifacts.pick` says which
matches of a glob count: `all` (default) or `newest` (the most recently modified match: Lightning's
`epoch=*.ckpt`, DeepSpeed's `global_step*/`). run_one resolves the entries when it syncs; the
files it found are recorded in MANIFEST.json and are the result from then on.

MANIFEST.json records each role as `{"file", "size", "sha256"}`, or for a checkpoint of several
files (any directory, glob or list entry) a list of those objects.
A Hugging Face `*.index.json` among the checkpoint files names its shards (`weight_map`); each must
be in the result as well.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
from typing import Any

GLOB_CHARS = frozenset("*?[")
PICKS = ("all", "newest")
INDEX_SUFFIX = ".index.json"


def entries(spec: Any) -> tuple[str, ...]:
    """The checkpoint entries of an `artifacts` argument: a string, or a list of strings."""
    if isinstance(spec, str):
        return (spec.rstrip("/"),) if spec else ()
    if isinstance(spec, (list, tuple)):
        return tuple(str(s).rstrip("/") for s in spec if isinstance(s, str) and s)
    return ()


def is_glob(entry: str) -> bool:
    return any(c in GLOB_CHARS for c in entry)


def covers(entry: str, file: str) -> bool:
    """Whether a recorded file is what the configured entry names: the entry itself, a file under it
    (a directory), or (a glob) a match of it or a file under a match, segment by segment as bash
    expands it (a `*` never crosses a `/`)."""
    want = entry.rstrip("/").split("/")
    have = file.split("/")
    if len(have) < len(want):
        return False
    return all(fnmatch.fnmatchcase(h, w) for h, w in zip(have, want, strict=False))


def recorded(manifest: dict[str, Any] | None, role: str) -> list[Any]:
    """The entries MANIFEST.json records for a role: [] when none, one for `{...}`, all of `[...]`."""
    arts = (manifest or {}).get("artifacts")
    value = arts.get(role) if isinstance(arts, dict) else None
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def manifest_files(manifest: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """[(role, entry)] for every file MANIFEST.json records, in its order (an entry may be malformed:
    the caller checks it)."""
    arts = (manifest or {}).get("artifacts")
    if not isinstance(arts, dict):
        return []
    return [(str(role), e) for role in arts for e in recorded(manifest, str(role))]


def index_shards(path: str, rel: str) -> tuple[list[str], str | None]:
    """The shard files (relative to the result dir) a `*.index.json` at `path` (`rel` in the dir)
    names in its `weight_map`, or an error."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return [], f"index {rel} unreadable: {type(e).__name__}: {e}"
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
        return [], f"index {rel} has no weight_map of tensor -> shard file"
    base = posixpath.dirname(rel)
    return sorted({posixpath.normpath(posixpath.join(base, v)) for v in wmap.values()}), None


PREFETCH = 32 << 20  # bytes asked of the disk ahead of the hash (posix_fadvise WILLNEED)


def sha256_file(path: str | os.PathLike[str], bufsize: int = 1 << 20) -> str:
    """sha256 of a file; the kernel reads the next PREFETCH bytes while this thread hashes."""
    h = hashlib.sha256()
    advise = getattr(os, "posix_fadvise", None)
    with open(path, "rb", buffering=0) as f:
        fd, pos, ahead = f.fileno(), 0, 0
        if os.fstat(fd).st_size < bufsize:  # a small file: one read, no buffer to allocate
            while chunk := f.read(bufsize):
                h.update(chunk)
            return h.hexdigest()
        view = memoryview(bytearray(bufsize))
        while True:
            if advise is not None and pos + bufsize > ahead:
                advise(fd, ahead, PREFETCH, os.POSIX_FADV_WILLNEED)
                ahead += PREFETCH
            n = f.readinto(view)
            if not n:
                break
            h.update(view[:n])
            pos += n
    return h.hexdigest()
