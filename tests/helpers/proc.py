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
