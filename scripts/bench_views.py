#!/usr/bin/env python3
"""What reading each queue's truth through its own host costs `status` (issue 11): round trips and
wall time of `ablate status --json` on N test-bed instances that mount the shared FS over sshfs,
this checkout against another (`--old DIR`, e.g. a commit before the per-host views), side by side
in one run, alternating (needs root; tests/testbed.py's sshfs mode).

A round trip is one command a host runs for us (`ShellHost.exec`, counted in the status process;
with the host agent each is one request over the open connection). Both variants ask each host
one command and the FS host one probe; the new one's host command also reads the host's own view.
Each measured status runs in a new process after one warm-up (connections and host agents up, as
for a user's repeated `status`).

    sudo python3 scripts/bench_views.py --old /path/to/old/checkout [--hosts 8] [--reps 7] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import REPO, host_queue, measured_line, median, publish, ratio, wait_until, write_project

from tests.helpers import fault_train
from tests.testbed import Testbed, missing_requirement

# `status --json` in this process with every host command counted; prints {"secs", "round_trips", "ok"}.
COUNTED = r"""
import json, sys, time
from ablate.transport import shellhost
n = [0]
for cls in shellhost.ShellHost.__subclasses__():
    orig = cls.exec
    def counted(self, *a, _orig=orig, **k):
        n[0] += 1
        return _orig(self, *a, **k)
    cls.exec = counted
from ablate.cli import main
import contextlib, io
out = io.StringIO()
t0 = time.perf_counter()
with contextlib.redirect_stdout(out):
    try:
        main(["-C", sys.argv[1], "status", "--json"])
    except SystemExit as e:
        code = e.code
secs = time.perf_counter() - t0
doc = json.loads(out.getvalue())
ok = all(q["state"] == "drained" for q in doc["queues"])
print(json.dumps({"secs": secs, "round_trips": n[0], "ok": ok}))
"""


def status_once(proj: Path, pythonpath: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    r = subprocess.run([sys.executable, "-c", COUNTED, str(proj)], env=env, capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"status failed: {r.stderr[-500:]}")
    got: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return got


def make_sweep(tb: Testbed, base: Path) -> Path:
    name, work = "bviews", tb.shared_dir / "work" / "bviews"
    work.mkdir(parents=True)
    (work / "train.py").write_text(Path(fault_train.__file__).read_text())
    cells = {h: [f"c{2 * i}", f"c{2 * i + 1}"] for i, h in enumerate(tb.hosts)}
    proj = base / "proj"
    proj.mkdir()
    ssh_config = proj / "ssh_config"
    tb.write_ssh_config(ssh_config)
    return write_project(
        proj, name, profile="tb", profile_settings={
            "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt/{name}",
            "python": sys.executable},
        configs={c: yaml.safe_dump({"seed": i}) for i, cs in enumerate(cells.values()) for c in cs},
        work=work, workdir=f"{tb.shared_path}/work/{name}",
        queues={h: host_queue(h, (f"configs/{c}.yaml recon" for c in cs)) for h, cs in cells.items()},
        train=(f"{sys.executable} train.py --config {{cfg}} --epochs {{epochs}} --out {{ckpt_dir}} "
               "--resume {resume} --name {name}"),
        artifacts={"checkpoint": fault_train.CKPT}, tasks={"recon": {"epochs": 1, "cost_per_epoch": 1}},
        budget={"ckpt_size": "1MB", "scratch": "1MB"}, heartbeat_secs=1, steal=False,
        ssh_config=str(ssh_config), hosts={h: {} for h in tb.hosts})


def cli(proj: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "ablate", "-C", str(proj), *args], env=env, check=True,
                   capture_output=True, timeout=300)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="the checkout to compare against")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    reason = missing_requirement("sshfs")
    if reason:
        print(f"bench_views: cannot run: {reason}", file=sys.stderr)
        return 2
    variants = {"this checkout": REPO, f"old ({a.old.name})": a.old.resolve()}
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory(prefix="ablate-bench-views-") as tmp, \
            Testbed(a.hosts, shared="sshfs") as tb:
        proj = make_sweep(tb, Path(tmp))
        cli(proj, "deploy")
        cli(proj, "launch", "--all")
        if not wait_until(lambda: status_once(proj, REPO)["ok"], 300, every=1):
            raise SystemExit("bench_views: the sweep did not drain in 300 s")
        for path in variants.values():
            status_once(proj, path)  # warm-up: connections, agents
        for _ in range(a.reps):
            for k, path in variants.items():
                got[k].append(status_once(proj, path))
    new, old = (median([r["secs"] for r in got[k]]) for k in variants)
    lines = ["## `status` reading each queue's truth through its own host", "",
             measured_line(f"sudo python3 scripts/bench_views.py --old <commit before> --hosts {a.hosts} "
                           f"--reps {a.reps}"), "",
             f"{a.hosts} test-bed instances mounting the shared FS over sshfs (default caches), a drained "
             "16-cell sweep; each `status --json` a new process after a warm-up, the two variants "
             "alternating.", "",
             "| variant | round trips per status | median wall time |", "| --- | ---: | ---: |"]
    for k in variants:
        trips = sorted({r["round_trips"] for r in got[k]})
        lines.append(f"| {k} | {'/'.join(map(str, trips))} | {median([r['secs'] for r in got[k]]):.2f} s |")
    lines += ["", f"Ratio (this / old): {ratio(new, old):.2f}x wall time."]
    publish("bench-views", lines, not a.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
