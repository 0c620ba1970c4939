"""Polling with a deadline: tests wait for a condition, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], object], timeout: float = 30.0, interval: float = 0.05) -> object:
    """Poll `cond` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {cond}")
        time.sleep(interval)
