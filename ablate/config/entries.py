"""Checkpoint entries as ablate.yaml names them: `artifacts.checkpoint`, and `resume:`, what a cell
resumes from (issue 45; the instance's side: ablate/remote/resume/).

    resume: checkpoint-*                  # entries as artifacts.checkpoint takes them: a file, a
                                          # directory, a glob, or a list; the newest match of a glob
    resume: {checkpoint: [last.ckpt], pick: newest}
    resume: false                         # no durable resume copies
    (absent)                              # the artifacts.checkpoint entries, newest of each glob
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ablate.config.reader import Reader
from ablate.remote.checkpoints.artifacts import PICKS

SAFE_GLOB_PATH = re.compile(r"^[A-Za-z0-9._/+@,=~*?\[\]-]+$")


@dataclass(frozen=True)
class Resume:
    """What under {ckpt_dir} a cell resumes from, and which match of a glob counts."""

    checkpoint: tuple[str, ...]
    pick: str = "newest"


def relative(path: str, pattern: re.Pattern[str]) -> bool:
    return bool(pattern.match(path)) and not path.startswith("/") and ".." not in path.split("/")


def checkpoint_entries(a: Reader, key: str = "checkpoint", what: str = "checkpoint") -> tuple[str, ...]:
    """A file, directory or glob relative to {ckpt_dir}, or a list of them, at `key` of `a`."""
    raw = a.data.get(key)
    if raw is None:
        raise a.err(key, "is required")
    return _entries(a, key, raw, what)


def _entries(a: Reader, key: str, raw: Any, what: str) -> tuple[str, ...]:
    items = raw if isinstance(raw, list) else [raw]
    if not items or not all(isinstance(i, str) and i.strip() for i in items):
        raise a.err(key, f"must be a file, directory or glob inside {{ckpt_dir}}, or a list of them, "
                         f"got {raw!r}")
    out: list[str] = []
    for item in items:
        entry = item.strip().rstrip("/")
        if not entry or entry == "." or not relative(entry, SAFE_GLOB_PATH):
            raise a.err(key, f"{item!r} must be a relative path inside {{ckpt_dir}} of plain characters "
                             f"(a glob may use * ? [ ]): the {what}")
        if entry not in out:
            out.append(entry)
    return tuple(out)


def parse_resume(r: Reader, checkpoint: tuple[str, ...]) -> Resume | None:
    """ablate.yaml's `resume:` (see the module's docstring); None when it is `false`."""
    raw = r.data.get("resume")
    if raw is None:
        return Resume(checkpoint)
    if raw is False:
        return None
    if isinstance(raw, dict):
        s = r.sub("resume", {"checkpoint", "pick"})
        pick = s.text("pick", "newest") or "newest"
        if pick not in PICKS:
            raise s.err("pick", f"must be newest (the most recently modified match of a glob, default) or "
                                f"all (every match), got {pick!r}")
        return Resume(checkpoint_entries(s, what="checkpoint a cell resumes from"), pick)
    if raw is True:
        raise r.err("resume", "true is the default; write the entries a cell resumes from, or false")
    return Resume(_entries(r, "resume", raw, "checkpoint a cell resumes from"))
