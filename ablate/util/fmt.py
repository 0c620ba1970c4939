"""Human formats shared by every command's text output, and the type of a progress-line callback."""

from __future__ import annotations

from collections.abc import Callable

Log = Callable[[str], None]  # one plain progress line for a human (stderr); data goes to stdout


def age(seconds: float) -> str:
    """How long ago, coarse: `45s`, `12m`, `3h05m`."""
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def duration(seconds: float | None) -> str:
    """A span for tables: `-` (unknown), `45s`, `3m05s`, `1h02m`, `2d03h`."""
    if seconds is None:
        return "-"
    s = round(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def size(n: float) -> str:
    """Bytes in decimal units, as ablate.yaml sizes are written (2GB = 2e9 bytes): `512 B`, `1.5 GB`."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def count(n: int) -> str:
    return f"{n:,}"
