"""Result dirs whose checkpoint is several files of different kinds, for the tests of how each file
was checked (issue 32): a file recorded in MANIFEST.json as run_one records a list of them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.results import sha256, write_checkpoint

# Bytes of a format nobody has a reader for: verified by size and sha256 only, whatever the config.
OPAQUE = b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 4


def add_checkpoint_file(cell_dir: Path, rel: str, data: bytes | None = None) -> Path:
    """Write `rel` in a result dir (a real checkpoint of its extension, or `data`) and record it as
    one more checkpoint file in its MANIFEST.json (the checkpoint becomes a list, as for a glob)."""
    path = cell_dir / rel
    if data is None:
        write_checkpoint(path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    mpath = cell_dir / "MANIFEST.json"
    manifest = json.loads(mpath.read_text())
    ckpt = manifest["artifacts"]["checkpoint"]
    entries = ckpt if isinstance(ckpt, list) else [ckpt]
    entries.append({"file": rel, "size": path.stat().st_size, "sha256": sha256(path)})
    manifest["artifacts"]["checkpoint"] = entries
    mpath.write_text(json.dumps(manifest, indent=1))
    return path
