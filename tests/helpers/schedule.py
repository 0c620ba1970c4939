"""Longest first: each test's seconds in the last runs, kept in pytest's cache, and the order the
xdist workers run the tests in when scripts/test.sh asks for it (ABLATE_TEST_LONGEST_FIRST=1).

`--dist loadgroup` hands each worker the next test in collection order as it runs out of work: a
long test collected late (the store-backed queues, the benchmarks' smoke tests: `tests/test_s*`)
starts when the others are nearly done and runs on alone. Collected longest first, the long ones
start at once, side by side, and the short ones fill the gaps. The order only changes when each
test runs, never what it runs with: every test still gets its own fixtures.

The seconds are recorded by the process that sees every test's report (the controller under xdist)
and read by it once, at start: every worker gets the same figures (`workerinput`), so they all
collect the same order, as xdist requires, even if another run updates the cache meanwhile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

KEY = "ablate/durations"
ENV = "ABLATE_TEST_LONGEST_FIRST"
INPUT = "ablate_durations"
# A fresh clone has no cache: the seconds of the tests that took 0.5 s or more in a run of the unit
# tier (scripts/test.sh unit; refresh it from `.pytest_cache/v/ablate/durations`), the others short.
SEED = Path(__file__).with_name("durations_seed.json")


def plain_id(nodeid: str) -> str:
    """The nodeid without the `@group` xdist's loadgroup appends (its own rule: an `@` after any `]`)."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


class Durations:
    """Each test's seconds (setup, call and teardown) this run, merged into the cache at its end: the
    mean of the last figure and this one, so one slow run moves a test half way."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seen: dict[str, float] = {}

    def recorded(self) -> dict[str, float]:
        cache = getattr(self.config, "cache", None)
        got = cache.get(KEY, {}) if cache is not None else {}
        return {str(k): float(v) for k, v in got.items()} if isinstance(got, dict) else {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist: hand the worker the figures to order by (only when asked for): the cache's, else
        the seed's, where a test not named is short."""
        if os.environ.get(ENV) == "1":
            got = self.recorded()
            if not got:
                try:
                    got = {str(k): float(v) for k, v in json.loads(SEED.read_text()).items()}
                    node.workerinput[INPUT + "_unnamed"] = 0.0
                except (OSError, ValueError, AttributeError):
                    got = {}
            node.workerinput[INPUT] = got

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        key = plain_id(report.nodeid)
        self.seen[key] = self.seen.get(key, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or hasattr(self.config, "workerinput") or not self.seen:
            return  # a worker's reports also reach the controller, which records them
        merged = self.recorded()
        for key, secs in self.seen.items():
            merged[key] = round((merged[key] + secs) / 2 if key in merged else secs, 3)
        cache.set(KEY, merged)


def longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker handed the figures: the items sorted by their recorded seconds, longest
    first; a test with no figure yet (new, or never run here) goes first, as it may be long (with
    the seed's figures: last, as it is short)."""
    given = getattr(config, "workerinput", {})
    durations, unnamed = given.get(INPUT), float(given.get(INPUT + "_unnamed", float("inf")))
    if not durations:
        return
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-durations.get(plain_id(item.nodeid), unnamed), order[id(item)]))



def one_last_collection(config: pytest.Config) -> None:
    """pytest's last look for unraisable exceptions runs the garbage collector five times at the
    end of each process: 1.2 s in the worker whose heap holds torch, transformers and lightning,
    often the last to end. Once finds the same cycles. (A private setting: left alone where this
    pytest has none.)"""
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key
    except ImportError:
        return
    config.stash[gc_collect_iterations_key] = 1
