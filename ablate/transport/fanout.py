"""Run one function per host in parallel and keep every host's outcome: a failure on one host never
hides what happened on the others (fabric's GroupResult, for both transports)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
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


def start_each(hosts: Iterable[K], fn: Callable[[K], R]) -> dict[K, Future[R]]:
    """Call `fn(host)` for every host at once, each on a daemon thread of its own: a caller may
    leave the call of a host it learns meanwhile to be gone (one that stopped itself) unawaited,
    and nothing, the interpreter's exit included, waits on that host's connect time-out."""
    out: dict[K, Future[R]] = {}
    for h in dict.fromkeys(hosts):
        fut: Future[R] = Future()
        out[h] = fut
        threading.Thread(target=_run, args=(fut, fn, h), name=f"ablate-ask-{h}", daemon=True).start()
    return out


def _run(fut: Future[R], fn: Callable[[K], R], h: K) -> None:
    try:
        fut.set_result(fn(h))
    except BaseException as e:  # the caller reads it as that host's outcome
        fut.set_exception(e)


def gather(futures: Mapping[K, Future[R]], gone: Mapping[K, Exception] | None = None) -> FanOut[K, R]:
    """`start_each`'s outcomes as `fan_out` gives them; a host in `gone` is not waited for: its
    outcome is the exception given."""
    out: FanOut[K, R] = FanOut()
    for h, fut in futures.items():
        if gone and h in gone:
            out[h] = gone[h]
            continue
        try:
            out[h] = fut.result()
        except Exception as e:
            out[h] = e
    return out
