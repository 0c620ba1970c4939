"""A regression guard on the SSH path, the one timed check of the suite (issue 47): on a test bed of
its own, first-contact `ablate launch --all` and a warm `ablate status --json` against GNU parallel's
`ssh HOST true` to the same hosts, medians of three, side by side. Ratios, not times, and two kinds:

- busy CPU-seconds on this side (the command and every process it starts, its ssh masters too, in a
  cgroup of their own) over parallel's: load hardly moves these (2026-11-28: launch ~1.1x, status
  ~0.2x, quiet or at a load of 10), so their limits sit under 3x what is measured and a change that
  makes either command do 3x the work fails;
- wall time over parallel's: load moves these a lot (parallel's handshakes suffer most: launch
  0.7x at a load of 10, ~1.8x quiet; a warm status up to 0.87x at a load of 13, where an agent's
  reply waits for the CPU), so their limits are loose, for a command that waits where it did not (a
  time-out, round trips one after another).

docs/BENCHMARKS.md ("The fan-out guard") has 20 runs in a row beside the suite;
`scripts/bench_fanout.py` has the figures and where the time goes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.wait import wait_for
from tests.testbed import Testbed, missing_requirement

pytestmark = pytest.mark.bed  # tests/helpers/tiers.py

HOSTS = 6
REPS = 3
# limits: (CPU-seconds ratio, wall ratio) to parallel `ssh true`
LAUNCH_LIMITS = (2.2, 4.0)  # first-contact `launch --all`
STATUS_LIMITS = (0.5, 2.0)  # warm `status --json`
REPO = Path(__file__).resolve().parent.parent
TRAIN = "mkdir -p {ckpt_dir} && cat {cfg} > {ckpt_dir}/ckpt.bin"


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    if shutil.which("parallel") is None:
        pytest.skip("the guard compares against GNU parallel: apt-get install parallel "
                    "(scripts/test.sh does)")
    with Testbed(HOSTS, startup_timeout=60.0) as tb:  # names and subnet of its own
        yield tb


def _project(tb: Testbed, base: Path, sweep: str, cfg: Path) -> Path:
    """One queue of one trivial cell per host (as scripts/bench_fanout.py's)."""
    proj = base / sweep
    (proj / "profiles").mkdir(parents=True)
    (proj / "profiles" / "tb.yaml").write_text(yaml.safe_dump({
        "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt",
        "python": sys.executable}))
    work = tb.shared_dir / "guard" / sweep
    (proj / "queues").mkdir()
    for where in (proj, work):
        (where / "configs").mkdir(parents=True)
    for i, host in enumerate(tb.hosts):
        for where in (proj, work):
            (where / "configs" / f"c{i}.yaml").write_text(f"seed: {i}\n")
        (proj / "queues" / f"q{i}.txt").write_text(f"# ablate: host={host}\nconfigs/c{i}.yaml t\n")
    (proj / "ablate.yaml").write_text(yaml.safe_dump({
        "profile": "tb", "sweep": sweep, "workdir": f"{tb.shared_path}/guard/{sweep}", "train": TRAIN,
        "artifacts": {"checkpoint": "ckpt.bin"}, "tasks": {"t": {"epochs": 1}},
        "budget": {"ckpt_size": "1MB", "scratch": "1MB"}, "heartbeat_secs": 1, "ssh_config": str(cfg),
        "hosts": {h: {} for h in tb.hosts}}, sort_keys=False))
    return proj


def _cpu_groups() -> Any:
    """scripts/benchlib.py's CpuGroups (cgroup CPU accounting), one group, `cmd`."""
    lib = sys.modules.get("benchlib")
    if lib is None:
        spec = importlib.util.spec_from_file_location("benchlib", REPO / "scripts" / "benchlib.py")
        assert spec is not None and spec.loader is not None
        lib = importlib.util.module_from_spec(spec)
        sys.modules["benchlib"] = lib  # before it runs: its dataclasses look their module up there
        spec.loader.exec_module(lib)
    groups = lib.CpuGroups(["guard"])
    assert groups.available, "no writable cgroup: the guard counts CPU-seconds in one (root has it)"
    return groups


def _timed(argv: list[str], env: dict[str, str], groups: Any) -> tuple[float, float]:
    """Wall seconds and busy CPU-seconds of `argv` with every process it starts."""
    cpu0 = groups.seconds("guard")
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL,
                       preexec_fn=lambda: groups.join("guard", os.getpid()))
    took = time.perf_counter() - t0
    cpu = groups.seconds("guard") - cpu0
    assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
    return took, cpu


def _drained(proj: Path, env: dict[str, str]) -> bool:
    p = subprocess.run([sys.executable, "-m", "ablate", "-C", str(proj), "status", "--json"],
                       capture_output=True, text=True, timeout=120, env=env)
    return p.returncode == 0 and all(r["state"] == "drained" for r in json.loads(p.stdout)["queues"])


def test_launch_and_warm_status_stay_within_their_ratio_to_ssh_true(bed: Testbed, tmp_path: Path) -> None:
    tb = bed
    cfg = tb.write_ssh_config(tmp_path / "ssh_config", extra="\nHost *\n  ConnectTimeout 5\n")
    ctl_root = Path(tempfile.mkdtemp(prefix="abg", dir="/tmp"))  # short: socket paths
    base = dict(os.environ, NO_COLOR="1")
    groups = _cpu_groups()
    parallel = ["parallel", "--will-cite", "-j0", "ssh", "-F", str(cfg), "-o", "ControlMaster=no",
                "-o", "ControlPath=none", "{}", "true", ":::", *tb.hosts]
    try:
        par: list[tuple[float, float]] = []
        launch: list[tuple[float, float]] = []
        proj = tmp_path
        env = base
        for r in range(REPS + 1):  # the first round warms the page cache and is dropped
            tb.end_agents()
            env = dict(base, ABLATE_SSH_CONTROL_DIR=tempfile.mkdtemp(dir=ctl_root))
            proj = _project(tb, tmp_path, f"g{os.getpid()}r{r}", cfg)
            took_launch = _timed([sys.executable, "-m", "ablate", "-C", str(proj), "launch", "--all"], env,
                                 groups)
            took_par = _timed(parallel, base, groups)
            if r:
                launch.append(took_launch)
                par.append(took_par)
        wait_for(lambda: _drained(proj, env), timeout=120, interval=0.5)
        status = [_timed([sys.executable, "-m", "ablate", "-C", str(proj), "status", "--json"], env, groups)
                  for _ in range(REPS)]

        def med(xs: list[tuple[float, float]], i: int) -> float:
            return statistics.median(x[i] for x in xs)

        figures = {name: (med(xs, 1) / med(par, 1), med(xs, 0) / med(par, 0))
                   for name, xs in (("launch", launch), ("status", status))}
        text = (f"parallel ssh true {med(par, 0):.3f}s, {med(par, 1):.3f} CPU-s; "
                f"first-contact launch --all {med(launch, 0):.3f}s, {med(launch, 1):.3f} CPU-s "
                f"(x{figures['launch'][1]:.2f} wall, x{figures['launch'][0]:.2f} CPU); "
                f"warm status --json {med(status, 0):.3f}s, {med(status, 1):.3f} CPU-s "
                f"(x{figures['status'][1]:.2f} wall, x{figures['status'][0]:.2f} CPU); "
                f"load {os.getloadavg()[0]:.1f}")
        print(f"fan-out guard, {HOSTS} hosts: {text}")
        for name, limits in (("launch", LAUNCH_LIMITS), ("status", STATUS_LIMITS)):
            for kind, got, limit in zip(("CPU", "wall"), figures[name], limits, strict=True):
                assert got <= limit, f"{name}: {kind} x{got:.2f} parallel `ssh true`, limit x{limit}: {text}"
    finally:
        groups.close()
        for d in ctl_root.iterdir():
            for sock in d.iterdir():
                subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True,
                               check=False)
        shutil.rmtree(ctl_root, ignore_errors=True)
        tb.end_agents()
