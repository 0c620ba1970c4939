"""A cell cut at Slurm's time limit: is it getting anywhere? Stdlib only (the runner's verb `cut`).

run_queue asks this after the cut cell has exited (its trainer saved what it resumes from). Each cut
is a line of `claims/<name>/cuts`, `time_limit ATTEMPT FINGERPRINT`, where the fingerprint is the
sha256 of the cell's checkpoint files as the profile's `artifacts.checkpoint` names them in its
checkpoint dir (relative path, size, mtime in ns): "no checkpoint" is a fingerprint too. A cell
whose checkpoint is the same at two time-limit cuts of different attempts did not move in a whole
job (it needs more than `time - grace` from where it resumes, or its trainer never resumes): it is
stopped, not re-entered again, and waits for `ablate remediate` with that said (`no_progress`).

The record lives in the claim, so a claim that remediate releases takes its history with it and a
re-run starts afresh. Other files in the checkpoint dir (logs, traces, TensorBoard events) do not
count: they change without progress.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable

from ablate.remote.queue.grammar import SAFE_NAME
from ablate.remote.queue.publish import SyncFailed, resolve

RECORD = "cuts"
NONE = "none"  # the fingerprint of a checkpoint dir holding no checkpoint file
_ATTEMPT = re.compile(r"[0-9_]{1,40}\.[0-9]{1,9}")  # SLURM_JOB_ID.SLURM_RESTART_COUNT


def fingerprint(ckpt_dir: str, checkpoint: str) -> str:
    """sha256 (16 hex digits) of the checkpoint files' (path, size, mtime_ns), or NONE."""
    try:
        files = resolve(ckpt_dir, checkpoint) if checkpoint.strip() else []
    except (SyncFailed, OSError):
        files = []
    h = hashlib.sha256()
    seen = 0
    for rel in sorted(files):
        try:
            st = os.stat(os.path.join(ckpt_dir, rel))
        except OSError:
            continue
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
        seen += 1
    return h.hexdigest()[:16] if seen else NONE


def read(path: str) -> list[tuple[str, str, str]]:
    """The cuts recorded so far: (reason, attempt, fingerprint); a malformed line is skipped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        w = line.split()
        if len(w) == 3:
            out.append((w[0], w[1], w[2]))
    return out


def stuck(before: list[tuple[str, str, str]], attempt: str, fp: str) -> str | None:
    """The earlier attempt whose time-limit cut left the same checkpoint as this one, if any."""
    last = next((c for c in reversed(before) if c[0] == "time_limit"), None)
    if last is not None and last[1] != attempt and last[2] == fp:
        return last[1]
    return None


def record(claim_dir: str, attempt: str, fp: str) -> str | None:
    """Add this cut to the claim's record (tmp + rename: one writer, the claim's owner) and say
    whether the cell is stuck (the earlier attempt) or may be re-entered (None)."""
    path = os.path.join(claim_dir, RECORD)
    before = read(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(f"{r} {a} {p}\n" for r, a, p in [*before, ("time_limit", attempt, fp)]))
    os.replace(tmp, path)
    return stuck(before, attempt, fp)


def verb(root: str, cell: str, attempt: str, ckpt_dir: str, checkpoint: str,
         out: Callable[[str], None]) -> int:
    """`cut --cell NAME --attempt A --ckpt-dir DIR --checkpoint "ENTRY ..."` (run_queue passes its
    spec's ABLATE_CKPT_ROOT/NAME and ABLATE_CHECKPOINT: the runner's process does not inherit the
    spec): `stuck EARLIER FINGERPRINT` or `resumable FINGERPRINT`; rc 2 for a bad cell, attempt or
    dir, 3 when the claim cannot be written (run_queue then re-enters the cell as before)."""
    if not (SAFE_NAME.fullmatch(cell) and _ATTEMPT.fullmatch(attempt) and os.path.isabs(ckpt_dir)
            and os.path.basename(ckpt_dir.rstrip("/")) == cell):
        return 2
    fp = fingerprint(ckpt_dir, checkpoint)
    try:
        earlier = record(os.path.join(root, "claims", cell), attempt, fp)
    except OSError:
        return 3
    out(f"stuck {earlier} {fp}" if earlier is not None else f"resumable {fp}")
    return 0
