"""A regression guard on the SSH path, the one timed check of the suite (issue 47): on a test bed of
its own, first-contact `ablate launch --all` and a warm `ablate status --json` against GNU parallel's
`ssh HOST true` to the same hosts, medians of three, side by side. A ratio, not a time: load slows
both sides. The limits sit about twice above what this machine measures under the suite's load
(docs/BENCHMARKS.md, "The fan-out guard": 20 runs in a row beside the suite), so a change that makes
either command 3x slower fails here instead of landing; `scripts/bench_fanout.py` has the figures
and where the time goes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers.wait import wait_for
from tests.testbed import Testbed, missing_requirement

pytestmark = pytest.mark.bed  # tests/helpers/tiers.py

HOSTS = 6
REPS = 3
LAUNCH_LIMIT = 2.5  # first-contact `launch --all` / parallel `ssh true`: ~0.9-1.3x measured
STATUS_LIMIT = 0.8  # warm `status --json` / parallel `ssh true`: ~0.15-0.4x measured
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


def _end_agents(tb: Testbed) -> None:
    """As after a reboot: no host agent runs on the instances."""
    for host in tb.hosts:
        for pid in subprocess.run(["ip", "netns", "pids", tb.netns(host)], capture_output=True,
                                  text=True, check=False).stdout.split():
            with contextlib.suppress(OSError):
                if b"ablate_agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(int(pid), signal.SIGKILL)


def _timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
    return took


def _drained(proj: Path, env: dict[str, str]) -> bool:
    p = subprocess.run([sys.executable, "-m", "ablate", "-C", str(proj), "status", "--json"],
                       capture_output=True, text=True, timeout=120, env=env)
    return p.returncode == 0 and all(r["state"] == "drained" for r in json.loads(p.stdout)["queues"])


def test_launch_and_warm_status_stay_within_their_ratio_to_ssh_true(bed: Testbed, tmp_path: Path) -> None:
    tb = bed
    cfg = tb.write_ssh_config(tmp_path / "ssh_config", extra="\nHost *\n  ConnectTimeout 5\n")
    ctl_root = Path(tempfile.mkdtemp(prefix="abg", dir="/tmp"))  # short: socket paths
    base = dict(os.environ, NO_COLOR="1")
    parallel = ["parallel", "--will-cite", "-j0", "ssh", "-F", str(cfg), "-o", "ControlMaster=no",
                "-o", "ControlPath=none", "{}", "true", ":::", *tb.hosts]
    try:
        par, launch = [], []
        proj = tmp_path
        env = base
        for r in range(REPS + 1):  # the first round warms the page cache and is dropped
            _end_agents(tb)
            env = dict(base, ABLATE_SSH_CONTROL_DIR=tempfile.mkdtemp(dir=ctl_root))
            proj = _project(tb, tmp_path, f"g{os.getpid()}r{r}", cfg)
            took_launch = _timed([sys.executable, "-m", "ablate", "-C", str(proj), "launch", "--all"], env)
            took_par = _timed(parallel, base)
            if r:
                launch.append(took_launch)
                par.append(took_par)
        wait_for(lambda: _drained(proj, env), timeout=120, interval=0.5)
        status = [_timed([sys.executable, "-m", "ablate", "-C", str(proj), "status", "--json"], env)
                  for _ in range(REPS)]
        p, lf, st = statistics.median(par), statistics.median(launch), statistics.median(status)
        figures = (f"parallel ssh true {p:.3f}s; launch --all (first contact) {lf:.3f}s = {lf / p:.2f}x; "
                   f"warm status --json {st:.3f}s = {st / p:.2f}x")
        print(f"fan-out guard, {HOSTS} hosts: {figures}")
        assert lf / p <= LAUNCH_LIMIT, f"first-contact `launch --all` regressed: {figures}"
        assert st / p <= STATUS_LIMIT, f"warm `status --json` regressed: {figures}"
    finally:
        for d in ctl_root.iterdir():
            for sock in d.iterdir():
                subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True,
                               check=False)
        shutil.rmtree(ctl_root, ignore_errors=True)
        _end_agents(tb)
