"""Run one function per host in parallel and keep every host's outcome: a failure on one host never
hides what happened on the others (fabric's GroupResult, for both transports)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


class FanOut(dict[K, R | Exception]):
    """Per-host results of a parallel call; a failure on one host keeps the others' results."""

    @property
    def succeeded(self) -> dict[K, R]:
        return {k: v for k, v in self.items() if not isinstance(v, Exception)}

    @property
    def failed(self) -> dict[K, Exception]:
        return {k: v for k, v in self.items() if isinstance(v, Exception)}


def fan_out(hosts: Iterable[K], fn: Callable[[K], R], *, max_workers: int = 32) -> FanOut[K, R]:
    """Call `fn(host)` for every host in parallel; each value is its result or its exception."""
    items = list(dict.fromkeys(hosts))
    out: FanOut[K, R] = FanOut()
    if not items:
        return out
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        futures = {h: pool.submit(fn, h) for h in items}
        for h, fut in futures.items():
            try:
                out[h] = fut.result()
            except Exception as e:
                out[h] = e
    return out
