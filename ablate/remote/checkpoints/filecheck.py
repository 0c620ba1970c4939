"""One artifact checked as its configuration says: by hash, by structure, or loaded. Stdlib only.

`check(path, ...)` reads the file once for its sha256 and its structure together, then (mode
`load`, or no mode where a load applies) loads it with its library (`ablate.remote.checkpoints.loaders`).
How each kind of file is checked without running anything from it:

  torch zip (.pt .pth .ckpt .bin)   every record's CRC32; data.pkl read to STOP by stubs; each storage
                                    it references a record with the bytes it needs (torchzip)
  legacy torch, pickles (.pkl ...)  read to STOP by stubs; a legacy file's storages walked to its end
  DCP `.metadata` / `*.distcp`      the metadata read to STOP by stubs; each item of a `.distcp` (one
                                    torch archive per item, at the ranges its `.metadata` gives) as above
  safetensors, .npy                 the header: dtypes, shapes, byte ranges covering the file exactly
  .npz                              every record's CRC32

Modes (ablate.yaml's `artifacts.verify`, per checkpoint entry): "hash" = size and sha256 only;
"structure" = the above, no library; "load" = must load with its library (a torch pickle whose
globals weights_only refuses, a plain pickle, a format without a library: corrupt, saying which
mode to use); None = the strongest that applies (a torch pickle is loaded when weights_only allows
its globals, else checked by structure).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import posixpath
import struct
import zipfile
from typing import NamedTuple

from ablate.remote.checkpoints import loaders, pickles, torchzip
from ablate.remote.checkpoints.artifacts import sha256_file

MODES = ("load", "structure", "hash")
# Kinds a library loads (mode None or load); their stdlib structure check is for mode structure.
LIBRARY_KINDS = ("safetensors", "npy", "npz", "json")
PICKLE_EXT = (".pkl", ".pickle")
DCP_METADATA = ".metadata"
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
                      "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
                      "C64": 8, "F4": 1, "F6_E2M3": 1, "F6_E3M2": 1, "E8M0": 1, "F8_E8M0": 1}


class Outcome(NamedTuple):
    kind: str | None  # None when it passed; else corrupt | no_loader
    error: str
    how: str  # how it passed: loaded | structure | hash | size


def _fail(error: str, kind: str = "corrupt") -> Outcome:
    return Outcome(kind, error, "")


def kind_of(path: str) -> str:
    """torch-zip | torch-legacy | pickle | npz | safetensors | npy | json | dcp-metadata | distcp |
    not-torch | other, from the name and (torch extensions) the first bytes."""
    lower = path.lower()
    base = posixpath.basename(lower)
    if base == DCP_METADATA:
        return "dcp-metadata"
    for ext, kind in ((".distcp", "distcp"), (".safetensors", "safetensors"), (".npy", "npy"),
                      (".npz", "npz"), (".json", "json")):
        if lower.endswith(ext):
            return kind
    if lower.endswith(loaders.TORCH_EXT + PICKLE_EXT):
        with open(path, "rb") as f:
            head = f.read(4)
        if head == torchzip.LOCAL_SIG or (head[:2] == b"PK" and zipfile.is_zipfile(path)):
            return "torch-zip"
        if head[:3] == b"\x80\x02\x8a":
            return "torch-legacy"
        if lower.endswith(PICKLE_EXT) or head[:1] == b"\x80":
            return "pickle"
        if not lower.endswith(".bin"):
            return "not-torch"  # a .bin may be any format; the others are torch's
    return "other"


def check(path: str, *, mode: str | None, sha256: str | None, load: bool,
          hashed: bool = False) -> Outcome:
    """Check one checkpoint file. sha256: the manifest's (checked in the same read), or None.
    load=False: size and hash only (`reconcile --no-load`). Raises loaders.NoLoader."""
    base = "hash" if sha256 is not None else "size"
    if not load or mode == "hash":
        return _hash_only(path, sha256, base)
    kind = kind_of(path)
    if kind in LIBRARY_KINDS and mode != "structure":
        # its library checks what the structure would, and more
        done = _hash_only(path, sha256, base)
        if done.kind:
            return done
        error = loaders.load_file(path, "checkpoint", hashed=hashed and sha256 is not None)
        return _fail(error) if error else Outcome(None, "", "loaded")
    digest, error, scan = _structure(path, kind, sha256 is not None)
    if kind == "not-torch":
        error = "not a torch checkpoint: neither a zip archive nor a pickle"
    if sha256 is not None and digest != sha256:
        return _fail("sha256 differs from MANIFEST.json (changed or damaged)")
    if error:
        return _fail(error)
    if kind in ("torch-zip", "torch-legacy") and scan is not None and mode != "structure":
        refused = loaders.weights_only_refuses(scan.globals)
        if not refused:
            try:
                loaders.load_torch(path, numpy_globals=bool(scan.globals & loaders.NUMPY_GLOBALS))
            except loaders.NoLoader:
                raise
            except Exception as e:  # any failure to load is the finding
                return _fail(f"load failed: {loaders.short(e)}")
            return Outcome(None, "", "loaded")
        if mode == "load":
            return _fail(f"load: torch.load(weights_only=True) refuses its globals ({_few(refused)}) "
                         "and nothing may run code from a checkpoint: use `verify: structure` for "
                         "this entry")
        return Outcome(None, "", "structure")
    if mode == "load":
        what = "a pickle" if kind in ("pickle", "dcp-metadata") else "this kind of file"
        return _fail(f"load: no library loads {what} without running code from it; use "
                     f"`verify: {'hash' if kind == 'other' else 'structure'}` for this entry")
    return Outcome(None, "", base if kind == "other" else "structure")


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _hash_only(path: str, sha256: str | None, how: str) -> Outcome:
    if sha256 is not None:
        try:
            if sha256_file(path) != sha256:
                return _fail("sha256 differs from MANIFEST.json (changed or damaged)")
        except OSError as e:
            return _fail(f"cannot read: {e}")
    return Outcome(None, "", how)


def _structure(path: str, kind: str, hash_it: bool) -> tuple[str | None, str | None, pickles.Scan | None]:
    """(sha256 or None, the first structural problem, a torch pickle's scan), in one read."""
    try:
        if kind in ("torch-zip", "npz", "distcp"):
            return _zip(path, kind, hash_it)
        if kind in ("torch-legacy", "pickle", "dcp-metadata"):
            return _pickle(path, kind, hash_it)
        digest = sha256_file(path) if hash_it else None
        if kind == "safetensors":
            return digest, _safetensors_header(path), None
        if kind == "npy":
            return digest, _npy_header(path), None
        if kind == "json":
            return digest, loaders.load_json(path, None), None
        return digest, None, None
    except OSError as e:
        return None, f"cannot read: {e}", None


def _zip(path: str, kind: str, hash_it: bool) -> tuple[str | None, str | None, pickles.Scan | None]:
    windows = None
    if kind == "distcp":
        windows, error = distcp_windows(path)
        if error:
            return (sha256_file(path) if hash_it else None), error, None
    records, error = torchzip.directory(path, windows)
    if error:
        return (sha256_file(path) if hash_it else None), error, None
    zpass = torchzip.ZipPass(records, torchzip.is_pickle_record)
    digest = torchzip.read_once(path, hash_it, zpass)
    problems = zpass.finish()
    if problems:
        return digest, problems[0], None
    if kind == "npz":
        return digest, None, None
    scan = None
    for w in range(len(windows) if windows is not None else 1):
        problem, scan = torchzip.check_archive(records, zpass.kept, w)
        if problem:
            where = f"item at {windows[w][0]}: " if windows is not None else ""
            return digest, where + problem, scan
    return digest, None, scan if kind == "torch-zip" else None


def _pickle(path: str, kind: str, hash_it: bool) -> tuple[str | None, str | None, pickles.Scan | None]:
    h = hashlib.sha256() if hash_it else None
    with open(path, "rb", buffering=1 << 20) as raw:
        f = pickles.Bounded(raw, os.fstat(raw.fileno()).st_size, h.update if h else None)
        stream = io.BufferedReader(f, 1 << 16)
        if kind == "torch-legacy":
            scan, error = pickles.scan_legacy_torch(stream)
        else:
            scan = pickles.scan(stream)
            error = scan.error
        while stream.read(1 << 20):  # the rest of the file, through the hash
            pass
    if error is None and kind == "dcp-metadata":
        error = _metadata_error(scan)
    return (h.hexdigest() if h else None), error, (scan if kind == "torch-legacy" else None)


def _metadata_error(scan: pickles.Scan) -> str | None:
    items = dcp_items(scan)
    return None if isinstance(items, list) else items


def dcp_items(scan: pickles.Scan) -> list[tuple[str, int, int, bool]] | str:
    """[(relative path, offset, length, plain: no transform applied)] of a DCP `.metadata`'s
    storage_data, or why it has none."""
    root = scan.root
    data = root.fields().get("storage_data") if isinstance(root, pickles.Stub) else None
    if not isinstance(data, dict):
        return "DCP .metadata has no storage_data"
    out = []
    for info in data.values():
        f = info.fields() if isinstance(info, pickles.Stub) else {}
        rel, off, length = f.get("relative_path"), f.get("offset"), f.get("length")
        if not (isinstance(rel, str) and isinstance(off, int) and isinstance(length, int)):
            return "DCP .metadata has a storage entry without relative_path, offset and length"
        out.append((rel, off, length, not f.get("transform_descriptors")))
    return out


def read_dcp_metadata(path: str) -> list[tuple[str, int, int, bool]] | str:
    try:
        with open(path, "rb") as f:
            scan = pickles.scan(pickles.Bounded(f, os.fstat(f.fileno()).st_size))  # type: ignore[arg-type]
    except OSError as e:
        return f"cannot read: {e}"
    return scan.error or dcp_items(scan)


def distcp_windows(path: str) -> tuple[list[tuple[int, int]] | None, str | None]:
    """The item ranges of a `.distcp` file, from the `.metadata` beside it."""
    meta = os.path.join(os.path.dirname(path), DCP_METADATA)
    if not os.path.isfile(meta):
        return None, f"no {DCP_METADATA} beside it: its items cannot be found"
    items = read_dcp_metadata(meta)
    if isinstance(items, str):
        return None, f"{DCP_METADATA}: {items}"
    name = os.path.basename(path)
    return sorted((off, length) for rel, off, length, plain in items if rel == name and plain), None


def _safetensors_header(path: str) -> str | None:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "safetensors header cut short (truncated)"
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 << 20):
            return f"safetensors header length {n} exceeds the file (truncated or damaged)"
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError) as e:
            return f"safetensors header is not JSON: {e}"
    if not isinstance(header, dict):
        return "safetensors header is not an object"
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = t["data_offsets"]
            count = 1
            for d in t["shape"]:
                count *= int(d)
            width = SAFETENSORS_DTYPES[t["dtype"]]
        except (KeyError, TypeError, ValueError):
            return f"safetensors tensor {name}: bad dtype, shape or data_offsets"
        if end - begin != count * width and t["dtype"] not in ("F4", "F6_E2M3", "F6_E3M2"):
            return f"safetensors tensor {name} needs {count * width} bytes, its range has {end - begin}"
        spans.append((begin, end))
    at = 0
    for begin, end in sorted(spans):
        if begin != at:
            return "safetensors tensors leave a gap or overlap in the data"
        at = end
    if 8 + n + at != size:
        return f"safetensors data is {size - 8 - n} bytes, its tensors need {at} (truncated or damaged)"
    return None


def _npy_header(path: str) -> str | None:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(10)
        if head[:6] != b"\x93NUMPY" or len(head) < 10:
            return "not a .npy file (no magic)"
        major = head[6]
        if major == 1:
            n, start = struct.unpack("<H", head[8:10])[0], 10
        else:
            head += f.read(2)
            n, start = struct.unpack("<I", head[8:12])[0], 12
        try:
            meta = ast.literal_eval(f.read(min(n, 1 << 20)).decode("latin1"))
            shape, descr = meta["shape"], meta["descr"]
        except (ValueError, SyntaxError, KeyError, TypeError):
            return ".npy header unreadable"
    if not isinstance(descr, str) or descr.startswith("|O"):
        return ".npy holds Python objects (pickled): not a tensor"
    count = 1
    for d in shape:
        count *= int(d)
    width = int("".join(c for c in descr if c.isdigit()) or 0)
    if start + n + count * width > size:
        return f".npy data needs {count * width} bytes, file has {size - start - n} (truncated)"
    return None
