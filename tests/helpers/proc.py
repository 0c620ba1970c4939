"""Processes as /proc has them."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int | str) -> bool:
    """Whether the process runs: a zombie (dead, waiting for its parent to reap it) does not, and
    neither does a pid with no /proc entry."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def state(pid: int | str) -> str:
    """The process's state letter (`T` stopped, `Z` zombie, ...); `gone` without a /proc entry."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def group(pgid: int) -> list[int]:
    """The processes of a process group."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                out.append(int(d.name))
    return out


def with_args(*words: str) -> list[int]:
    """The processes whose arguments include every one of `words` (each a whole argument)."""
    want = [w.encode() for w in words]
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if all(w in argv for w in want):
                out.append(int(d.name))
    return out
