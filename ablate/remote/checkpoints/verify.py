"""Verify result directories without running their code (rule 7). Stdlib-only at import.

This module is shipped to instances (beside `ablate/remote/host/probe.py`), so it imports nothing outside the
standard library at module level; torch, safetensors and numpy are imported only when a file that
needs them is met, and a missing library is a problem that says how to install it.

A result dir (`final_ckpts/<name>/` on the shared FS, or its pulled copy) holds the checkpoint's
file(s), the metrics file, `<name>.log` and `MANIFEST.json` (docs/ARCHITECTURE.md; which files the
checkpoint is: `ablate.remote.checkpoints.artifacts`). The recorded checkpoint files must match ablate.yaml's
entries, and an index's shards must all be there. Each file is checked in order and the first
failure is its problem:
  present -> non-empty (checkpoint, metrics, manifest; a log may be empty if its manifest says so,
  and so may a file found in a checkpoint directory)
  -> size and sha256 equal to MANIFEST.json (a truncated file is corrupt even if it loads)
  -> a checkpoint file's structure, in the same read as its sha256, and its load
     (`ablate.remote.checkpoints.filecheck`: torch archives' CRCs, pickles read to STOP by stubs, storages;
     then torch `weights_only=True` where its globals allow, safetensors, numpy
     `allow_pickle=False`), as `artifacts.verify` says per entry; metrics parse as a JSON object
     holding the configured keys. Other checkpoint types are checked by size and hash only.
  -> across files: every shard an index names, and the directories frameworks write
     (`ablate.remote.checkpoints.framework_dirs`: DeepSpeed, DCP, HF Trainer, accelerate, PEFT).

A problem is `{"file", "kind", "error"}` with kind one of missing | zero_byte | corrupt | no_loader.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import posixpath
import sys
from collections.abc import Callable
from typing import Any

from ablate.remote.checkpoints import artifacts as arts
from ablate.remote.checkpoints import filecheck, framework_dirs, loaders
from ablate.remote.checkpoints.artifacts import sha256_file
from ablate.remote.layout import MANIFEST

# Below this many dirs, the thread pool costs more than it saves.
PARALLEL_MIN = 4
MAX_WORKERS = 8  # each worker may hold one large tensor in memory at a time

Problem = dict[str, str]
NoLoader = loaders.NoLoader
load_file = loaders.load_file


def _problem(file: str, kind: str, error: str) -> Problem:
    return {"file": file, "kind": kind, "error": error}


def _failed(file: str, kind: str, error: str) -> tuple[Problem, str]:
    return _problem(file, kind, error), ""


def _read_manifest(path: str) -> tuple[dict[str, Any] | None, str | None, Problem | None]:
    """(manifest, sha256 of its bytes, problem)."""
    mpath = os.path.join(path, MANIFEST)
    try:
        with open(mpath, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None, None, _problem(MANIFEST, "missing", "no MANIFEST.json: not a complete result")
    except OSError as e:
        return None, None, _problem(MANIFEST, "corrupt", f"cannot read: {e}")
    digest = hashlib.sha256(raw).hexdigest()
    if not raw:
        return None, digest, _problem(MANIFEST, "zero_byte", "MANIFEST.json is empty")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        return None, digest, _problem(MANIFEST, "corrupt",
                                      f"MANIFEST.json is not valid JSON: {loaders.short(e)}")
    if not isinstance(data, dict) or not isinstance(data.get("artifacts"), dict):
        return None, digest, _problem(MANIFEST, "corrupt", "MANIFEST.json has no artifacts object")
    return data, digest, None


def safe_relpath(file: Any) -> bool:
    """A manifest's file name must stay inside the result dir."""
    if not isinstance(file, str) or not file or file.startswith("/") or "\\" in file or "\x00" in file:
        return False
    norm = posixpath.normpath(file)
    return norm == file and not norm.startswith("..") and norm not in (".", MANIFEST)


def expected_files(name: str, artifacts: dict[str, Any],
                   manifest: dict[str, Any] | None) -> list[tuple[str, str, Any]]:
    """[(role, file, its MANIFEST.json entry or None)] a result dir must hold besides MANIFEST.json.

    The manifest says which files the checkpoint is (run_one resolved its globs and directories)
    and where each artifact sits; ablate.yaml says which artifacts exist. Without a manifest, the
    configured plain file names (a glob or directory cannot be expanded after the fact).
    """
    out: list[tuple[str, str, Any]] = []
    configured = {"checkpoint": arts.entries(artifacts.get("checkpoint")),
                  "metrics": arts.entries(artifacts.get("metrics")), "log": (f"{name}.log",)}
    for role, names in configured.items():
        if not names:
            continue
        entries = arts.recorded(manifest, role) if manifest is not None else []
        if not entries:
            out += [(role, n, None) for n in names if not arts.is_glob(n)]
            continue
        for entry in entries:
            file = entry.get("file") if isinstance(entry, dict) else None
            # run_one keeps each file's path relative to {ckpt_dir} (it may be in a sub dir).
            if safe_relpath(file):
                out.append((role, str(file), entry))
            elif role != "checkpoint":
                out.append((role, names[0], entry))
            else:
                out.append((role, f"<{role} entry {len(out)}>", {"malformed": True}))
    return out


def verify_cell_dir(path: str, artifacts: dict[str, Any], *, load: bool = True,
                    check_hash: bool = True, pool: concurrent.futures.Executor | None = None,
                    ) -> list[Problem]:
    """Every problem of one result dir; [] means it is verified.

    artifacts: {"checkpoint": entry or [entries], "pick", "metrics": file or None,
    "metrics_keys": [...]}. load=False checks existence, sizes and (check_hash) sha256 against
    MANIFEST.json only. pool: check the files side by side (a sharded checkpoint of one cell).
    """
    return check_cell_dir(path, artifacts, load=load, check_hash=check_hash, pool=pool)[0]


def check_cell_dir(path: str, artifacts: dict[str, Any], *, load: bool = True,
                   check_hash: bool = True, pool: concurrent.futures.Executor | None = None,
                   ) -> tuple[list[Problem], dict[str, str]]:
    """(every problem of one result dir, how each file that passed was checked).

    How: "loaded" (read by its library, after its structure where it has one), "structure" (its
    structure checked without running anything from it: ablate.remote.checkpoints.filecheck), "hash" (size and
    sha256 against MANIFEST.json only) or "size" (size only: check_hash=False and nothing more).
    artifacts["verify"] ({checkpoint entry: "load" | "structure" | "hash"}) says how each entry's
    files are checked; absent, the strongest that applies.
    """
    path = os.fspath(path)
    name = os.path.basename(os.path.normpath(path))
    if not os.path.isdir(path):
        return [_problem("", "missing", f"no result directory {path}")], {}
    manifest, _digest, mproblem = _read_manifest(path)
    problems = [mproblem] if mproblem else []
    if manifest is not None and manifest.get("name") not in (None, name):
        problems.append(_problem(MANIFEST, "corrupt",
                                 f"MANIFEST.json is for cell {manifest.get('name')!r}, not {name!r}"))
    files = [f for f in expected_files(name, artifacts, manifest)
             if manifest is not None or not os.path.isdir(os.path.join(path, f[1]))]
    if manifest is not None:
        problems += _checkpoint_coverage(path, artifacts, files)

    def check(f: tuple[str, str, Any]) -> tuple[Problem | None, str]:
        return _check_file(path, f[0], f[1], f[2], manifest is not None, artifacts, load, check_hash)

    found = list(pool.map(check, files) if pool is not None and len(files) > 2 else map(check, files))
    checks = {f[1]: how for f, (p, how) in zip(files, found, strict=True) if p is None}
    return problems + [p for p, _ in found if p], checks


def _checkpoint_coverage(path: str, artifacts: dict[str, Any],
                         files: list[tuple[str, str, Any]]) -> list[Problem]:
    """The recorded checkpoint files against ablate.yaml's entries (each entry found, each file
    named by an entry), and every shard an index file names in the result."""
    configured = arts.entries(artifacts.get("checkpoint"))
    ckpt = [f for role, f, _ in files if role == "checkpoint"]
    out: list[Problem] = []
    for entry in configured:
        if not any(arts.covers(entry, f) for f in ckpt):
            out.append(_problem(entry, "corrupt", "MANIFEST.json records no checkpoint file for "
                                                  f"it; ablate.yaml expects {entry}"))
    have = set(ckpt)
    for f in ckpt:
        if f.endswith(arts.INDEX_SUFFIX) and os.path.isfile(os.path.join(path, f)):
            shards, error = arts.index_shards(os.path.join(path, f), f)
            if error:
                out.append(_problem(f, "corrupt", error))
            out += [_problem(s, "missing", f"index {f} names shard {s}, which is not in the result")
                    for s in shards if s not in have]
    return out + framework_dirs.coverage(path, ckpt)


def verify_mode(artifacts: dict[str, Any], file: str) -> str | None:
    """How ablate.yaml says a checkpoint file is checked (`artifacts.verify`: {entry: load |
    structure | hash}, the first entry covering the file), or None: the strongest that applies."""
    modes = artifacts.get("verify")
    if not isinstance(modes, dict):
        return None
    for entry, how in modes.items():
        if isinstance(entry, str) and how in filecheck.MODES and arts.covers(entry.rstrip("/"), file):
            return str(how)
    return None


def _check_file(path: str, role: str, file: str, entry: Any, have_manifest: bool,
                artifacts: dict[str, Any], load: bool, check_hash: bool) -> tuple[Problem | None, str]:
    """(the file's problem or None, how it was checked)."""
    if isinstance(entry, dict) and entry.get("malformed"):
        return _failed(file, "corrupt", f"MANIFEST.json has a malformed {role} entry")
    full = os.path.join(path, file)
    try:
        size = os.stat(full).st_size
    except FileNotFoundError:
        return _failed(file, "missing", f"{role} file {file} is missing")
    except OSError as e:
        return _failed(file, "corrupt", f"cannot stat: {e}")
    if not os.path.isfile(full):
        return _failed(file, "corrupt", f"{file} is not a regular file")
    want_size = entry.get("size") if isinstance(entry, dict) else None
    # A log may be empty, and so may a file run_one found in a checkpoint directory, as recorded.
    may_be_empty = role == "log" or (role == "checkpoint" and want_size == 0
                                     and file not in arts.entries(artifacts.get("checkpoint")))
    if size == 0 and (not may_be_empty or (isinstance(want_size, int) and want_size > 0)):
        return _failed(file, "zero_byte", f"{role} file {file} is empty (0 bytes)")
    if have_manifest:
        if not isinstance(entry, dict):
            return _failed(file, "corrupt", f"MANIFEST.json does not record the {role}")
        configured = arts.entries(artifacts.get(role))
        if role == "checkpoint" and not any(arts.covers(c, file) for c in configured):
            return _failed(file, "corrupt", f"MANIFEST.json records checkpoint file {file}, which none "
                                             f"of ablate.yaml's entries ({', '.join(configured)}) names")
        if role == "metrics" and configured and posixpath.normpath(configured[0]) != file:
            return _failed(file, "corrupt", f"MANIFEST.json records {role} {file}, ablate.yaml expects "
                                             f"{configured[0]}")
        if want_size != size:
            return _failed(file, "corrupt", f"size {size} bytes, MANIFEST.json says {want_size} "
                                             "(truncated or changed)")
    sha = entry.get("sha256") if have_manifest and check_hash and isinstance(entry, dict) else None
    if have_manifest and check_hash and not isinstance(sha, str):
        return _failed(file, "corrupt", "sha256 differs from MANIFEST.json (changed or damaged)")
    try:
        if role == "checkpoint":
            # The hash and the structure in one read of the file (ablate.remote.checkpoints.filecheck).
            out = filecheck.check(full, mode=verify_mode(artifacts, file), sha256=sha, load=load,
                                  hashed=sha is not None)
            return (_problem(file, out.kind, out.error), "") if out.kind else (None, out.how)
        if sha is not None and sha256_file(full) != sha:
            return _failed(file, "corrupt", "sha256 differs from MANIFEST.json (changed or damaged)")
        if load and role == "metrics":
            error = load_file(full, role, list(artifacts.get("metrics_keys") or []))
            return _failed(file, "corrupt", error) if error else (None, "loaded")
    except NoLoader as e:
        return _failed(file, "no_loader", str(e))
    except OSError as e:
        return _failed(file, "corrupt", f"cannot read: {e}")
    return None, "hash" if sha is not None else "size"


def _stat_files(path: str, files: list[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for file in files:
        try:
            st = os.stat(os.path.join(path, file))
        except OSError:
            continue
        out[file] = [st.st_size, st.st_mtime_ns]
    return out


def describe_dir(path: str, artifacts: dict[str, Any], verify: bool, load: bool,
                 check_hash: bool, pool: concurrent.futures.Executor | None = None) -> dict[str, Any]:
    """What a caller needs about one result dir: its manifest, file stats and (verify) problems."""
    name = os.path.basename(os.path.normpath(path))
    manifest, digest, _ = _read_manifest(path)
    files = [f for _, f, _ in expected_files(name, artifacts, manifest)] + [MANIFEST]
    problems, checks = check_cell_dir(path, artifacts, load=load, check_hash=check_hash, pool=pool) \
        if verify else (None, None)
    return {"manifest": manifest, "manifest_sha256": digest, "files": _stat_files(path, files),
            "problems": problems, "checks": checks}


def _describe_job(job: tuple[str, dict[str, Any], bool, bool, bool]) -> dict[str, Any]:
    return describe_dir(*job)


def verify_tree(args: dict[str, Any],
                progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """Describe every result dir under args["dir"], verifying those named in args["names"].

    args: dir (the directory holding `<name>/` result dirs), artifacts, names (list, or None for
    every dir), also (names looked up by their exact path even when the listing lacks them: on a
    network FS a listing may lag another host's rename by seconds, a lookup of a name asks the
    server), load (default True), hash (default True), workers (default: CPU count, at most
    MAX_WORKERS; serial below PARALLEL_MIN dirs).
    Returns {"dir", "exists", "entries": every name in dir (staging dirs too), "dirs": non-hidden
    dirs, "cells": {name: {"manifest", "manifest_sha256", "files": {file: [size, mtime_ns]},
    "problems": list or None when not verified, "checks": {file: how it passed} (check_cell_dir)
    or None when not verified}}}. Plain JSON, so a host can print it.
    `progress(done, total, name)` is called as each dir is described (a controller's progress bar).
    """
    root = str(args["dir"])
    artifacts = dict(args.get("artifacts") or {})
    load = bool(args.get("load", True))
    check_hash = bool(args.get("hash", True))
    names = args.get("names")
    try:
        entries = sorted(os.listdir(root))
        exists = True
    except FileNotFoundError:
        entries, exists = [], False
    dirs = [e for e in entries if not e.startswith(".") and os.path.isdir(os.path.join(root, e))]
    unlisted = {str(n) for n in args.get("also") or () if isinstance(n, str) and n and "/" not in n
                and not n.startswith(".")} - set(entries)
    found = [n for n in unlisted if exists and os.path.isdir(os.path.join(root, n))]
    entries, dirs = sorted(entries + found), sorted(dirs + found)
    wanted = set(dirs) if names is None else set(names)
    jobs = [(os.path.join(root, d), artifacts, d in wanted, load, check_hash) for d in dirs]
    workers = max(1, int(args.get("workers") or min(os.cpu_count() or 1, MAX_WORKERS)))
    heavy = sum(1 for j in jobs if j[2])
    results: list[dict[str, Any]] = []

    def done(result: dict[str, Any]) -> None:
        results.append(result)
        if progress is not None:
            progress(len(results), len(jobs), dirs[len(results) - 1])

    if workers <= 1 or not jobs:
        for j in jobs:
            done(_describe_job(j))
    elif heavy < PARALLEL_MIN:
        # Few dirs: side by side within each dir instead (the shards of a sharded checkpoint).
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as files_pool:
            for j in jobs:
                done(describe_dir(*j, pool=files_pool))
    else:
        # Threads, not processes: sha256 (hashlib) and the loaders (torch, safetensors, numpy) release
        # the GIL on large buffers, and one process imports torch once instead of once per worker
        # (measured in scripts/bench_reconcile.py: 200 MB torch files 18 % -> 51 % of `cat`).
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as ex:
            # Chunks: one round trip per small dir costs more than verifying it.
            chunk = max(1, min(32, len(jobs) // (workers * 4)))
            for result in ex.map(_describe_job, jobs, chunksize=chunk):
                done(result)
    return {"dir": root, "exists": exists, "entries": entries, "dirs": dirs,
            "cells": dict(zip(dirs, results, strict=True))}


def main(argv: list[str]) -> int:
    """`python -m ablate.remote.checkpoints.verify DIR ARTIFACTS_JSON`: print verify_tree's JSON (used
    over SSH)."""
    if len(argv) != 2:
        print("usage: python -m ablate.remote.checkpoints.verify DIR ARTIFACTS_JSON", file=sys.stderr)
        return 2
    out = verify_tree({"dir": argv[0], "artifacts": json.loads(argv[1])})
    print(json.dumps(out))
    bad = any(c["problems"] for c in out["cells"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
