"""The suite's three tiers (`bash scripts/test.sh unit|tmux|bed`):

- `unit`: every test that needs neither root, tmux nor a test bed: the Python packages only, no
  `apt-get`. It is what is left once the two below are taken out.
- `tmux`: tests that run real tmux (and the other tools `apt-get` installs: OpenSSH's server,
  shellcheck, chromium, GNU parallel), but no root and no bed: marked `@pytest.mark.tmux`, or a
  module's `pytestmark`.
- `bed`: tests on a namespace test bed (root: real sshd instances, sshfs, the Slurm cluster): every
  test that asks for a bed fixture, and those marked `@pytest.mark.bed`.

A unit-tier test runs with the apt-installed tools shadowed on its PATH by stubs that fail (exit
127, naming the test's missing mark), in every run, the full one included: a test that needs one
and is not marked fails where it runs, so the unit tier runs alone on a machine without them.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

# The fixtures that bring up a namespace test bed (tests/conftest.py) and their xdist groups: each
# group runs in one worker, so a bed is built once, and the groups that mostly wait run side by side.
# The module overrides of `testbed` (tests/helpers/testbed_projects.py: sshfs_testbed) ask for both
# SSH beds, hence one group for the two.
BED_GROUPS = (("slurm_cluster", "slurm"), ("testbed_slowfs", "slowfs"), ("testbed_sshfs", "ssh"),
              ("testbed", "ssh"), ("testbed_nofs", "nofs"))
# The groups longest first (each one's seconds in a full run: slurm ~920, ssh ~810, nofs ~240, slowfs
# ~130): the full run collects their tests first, in this order, and turns off xdist's own reorder (by
# the number of tests in a group), so each of the two longest groups is a different worker's first
# work. xdist hands every worker two units at the start: reordered by count, ssh (98 tests) and slurm
# (31) were one worker's first two, 29 of a 30-minute run's minutes on one worker.
GROUP_ORDER = ("slurm", "ssh", "nofs", "slowfs")
TIERS = ("unit", "tmux", "bed")
# What scripts/test.sh installs with apt-get (the commands of each package a test may run).
APT_TOOLS = ("tmux", "ssh", "sshd", "scp", "sshfs", "rsync", "chromium", "parallel", "shellcheck",
             "ip", "sbatch", "srun", "squeue", "scancel", "scontrol", "sacct", "sacctmgr", "sinfo",
             "slurmd", "slurmctld", "slurmdbd", "munge", "munged", "mariadbd", "mysqld")


def tier_of(item: pytest.Item) -> str:
    """The item's tier, from its bed fixtures and its marks (a bed test may also mark `tmux`)."""
    names = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("bed") or any(fixture in names for fixture, _ in BED_GROUPS):
        return "bed"
    if item.get_closest_marker("tmux"):
        return "tmux"
    return "unit"


def classify(items: list[pytest.Item]) -> None:
    """Mark each item with its tier (`-m unit` selects them) and each bed test with its xdist group."""
    for item in items:
        tier = tier_of(item)
        if tier != "tmux":
            item.add_marker(getattr(pytest.mark, tier))
        names = set(getattr(item, "fixturenames", ()))
        group = next((g for fixture, g in BED_GROUPS if fixture in names), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def groups_first(items: list[pytest.Item]) -> None:
    """The items of the long xdist groups first, longest group first (GROUP_ORDER); the rest keep
    their order after them."""
    def rank(item: pytest.Item) -> int:
        marker = item.get_closest_marker("xdist_group")
        group = marker.args[0] if marker and marker.args else None
        return GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER)

    items.sort(key=rank)  # stable: each group's tests, and the rest, in collection order


def note_alone_files(items: list[pytest.Item]) -> None:
    """With ABLATE_TEST_ALONE_FILES set, write there the test files that hold a test marked `alone`
    (of the tier ABLATE_TEST_ALONE_TIER, when set), one a line (every item collected, before `-m`
    deselects any): scripts/test.sh runs its `alone` pass on these files only, instead of
    collecting the whole suite again, and none when there are none. Every xdist worker collects the
    same items and writes the same lines (atomically, by rename)."""
    out = os.environ.get("ABLATE_TEST_ALONE_FILES")
    if not out:
        return
    tier = os.environ.get("ABLATE_TEST_ALONE_TIER")
    files = sorted({str(item.path) for item in items
                    if item.get_closest_marker("alone") and tier in (None, tier_of(item))})
    tmp = f"{out}.{os.getpid()}"
    Path(tmp).write_text("".join(f"{f}\n" for f in files))
    os.replace(tmp, out)


@functools.cache
def python_first() -> tuple[str, ...]:
    """The directory of the interpreter running the tests, when `python3` there is it, to go first on
    a test's PATH: the `python3` that the wrappers and tools the tests start run is then this one,
    found at once, not through a version manager's shim (pyenv's runs a dozen processes for each
    `python3`, a twentieth of a second of CPU). Found once per process: it does not change."""
    here = Path(sys.executable).parent
    py = here / "python3"
    try:
        same = py.exists() and py.resolve() == Path(sys.executable).resolve()
    except OSError:
        same = False
    return (str(here),) if same else ()


def stub_dir(base: Path) -> Path:
    """A directory of stubs, one per apt-installed tool, each failing with a line that says why."""
    out = base / "unit-tier-path"
    if not out.is_dir():
        out.mkdir(parents=True)
        for tool in APT_TOOLS:
            stub = out / tool
            stub.write_text(f"#!/bin/sh\necho '{tool}: not in the unit tier; mark the test tmux or bed "
                            f"(tests/helpers/tiers.py)' >&2\nexit 127\n")
            stub.chmod(0o755)
    return out
