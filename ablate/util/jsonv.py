"""Typed reads of values from parsed JSON written by another process (a runner, another controller,
another version): the value when it has the type, else None — never an exception."""

from __future__ import annotations

import math
from typing import Any


def as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def as_num(v: Any) -> float | None:
    """A finite number as float (ints too; never a bool)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None
