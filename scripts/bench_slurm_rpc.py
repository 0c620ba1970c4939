#!/usr/bin/env python3
"""How often `ablate status` and `ablate status --watch` ask Slurm: this checkout against the adapter
of commit 9ef7ea7 (before the polling budget), side by side on one real cluster (needs root and
Slurm: tests/slurmbed.py with accounting, so sacct answers as on a site that keeps it).

One sweep of 4 queues (`transport: slurm`, `queues: 4`) is launched by this checkout; every cell
hangs after its first epoch (tests/helpers/fault_train.py's `.hang` fault), so three jobs stay
RUNNING and one PENDING (three one-CPU nodes) while the bench measures; one more queue is stopped
(its job CANCELLED, then forgotten by squeue only after MinJobAge: so sacct has a job to tell).
The old version is `git archive 9ef7ea7 ablate wrappers profiles` unpacked into a temp dir and run
with it first on PYTHONPATH; both run as `<python> -m ablate -C PROJ ...`, each its own process.

Counted, for each version:
  shims    every call of squeue, sacct, sinfo, sbatch, scontrol and sacctmgr made by the measured
           command (and its children): a shim of each on PATH logs its name, then execs the real one;
  sdiag    slurmctld's own counters (`sdiag -r` before, `sdiag` after): the client RPCs it served
           (REQUEST_JOB_INFO, REQUEST_JOB_USER_INFO, REQUEST_NODE_INFO, REQUEST_PARTITION_INFO,
           REQUEST_FED_INFO, REQUEST_BUILD_INFO, REQUEST_SUBMIT_BATCH_JOB, ...; sacct and sacctmgr
           go to slurmdbd and show only in the shims). The running jobs' own traffic in the same
           window is counted too (they make none while their trainers hang).
per status: `--reps` runs of `ablate status --json`, the versions alternating; medians.
per minute of --watch: `ablate status --watch` (no terminal: the plain table every 2 s) for
`--watch-seconds`, then Ctrl-C; counts scaled to a minute.

Prints the table and writes it, with the machine, to docs/BENCHMARKS.md between the
bench_slurm_rpc markers.

    sudo python3 scripts/bench_slurm_rpc.py [--reps 5] [--watch-seconds 60] [--no-write]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import REPO, ablate_version, measured_line, median, publish, wait_until, write_project

from tests import slurmbed
from tests.helpers import fault_train
from tests.slurmbed import SlurmBed

OLD = "9ef7ea7"
COUNTED = ("squeue", "sacct", "sinfo", "sbatch", "scontrol", "sacctmgr")
CLIENT_RPCS = ("REQUEST_JOB_INFO", "REQUEST_JOB_USER_INFO", "REQUEST_JOB_INFO_SINGLE",
               "REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE", "REQUEST_PARTITION_INFO",
               "REQUEST_FED_INFO", "REQUEST_BUILD_INFO", "REQUEST_SUBMIT_BATCH_JOB",
               "REQUEST_CANCEL_JOB_STEP", "REQUEST_KILL_JOB", "REQUEST_UPDATE_JOB", "REQUEST_CONFIG",
               "REQUEST_ASSOC_MGR_INFO", "REQUEST_RESERVATION_INFO")
_SDIAG = re.compile(r"^\s*([A-Z_]+)\s+\(\s*\d+\)\s+count:(\d+)", re.M)


def old_tree(tmp: Path) -> Path:
    root = tmp / "old"
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", OLD, "ablate", "wrappers", "profiles"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    for d in ("wrappers", "profiles"):  # what setup.cfg maps into the installed package
        shutil.copytree(root / d, root / "ablate" / d)
    return root


def shims(tmp: Path) -> Path:
    d = tmp / "shims"
    d.mkdir()
    for name in COUNTED:
        real = shutil.which(name)
        assert real, f"{name} is not installed"
        p = d / name
        p.write_text(f'#!/bin/sh\necho {name} >>"$RPC_LOG"\nexec {real} "$@"\n')
        p.chmod(0o755)
    return d


def project(sb: SlurmBed, tmp: Path) -> tuple[Path, Path]:
    """A project of 5 queues of 2 cells, every cell hanging after its first epoch. (proj, sweep root)"""
    sweep = f"r{uuid.uuid4().hex[:6]}"
    shared = sb.shared_dir
    work = shared / "work" / sweep
    (work / "faults").mkdir(parents=True)
    shutil.copyfile(fault_train.__file__, work / "fault_train.py")
    for i in range(10):
        (work / "faults" / f"c{i}.hang").write_text("1\n")
    proj = write_project(
        tmp / "proj", sweep, profile="cluster", profile_settings={
            "transport": "slurm", "shared_fs": str(shared / "fs"),
            "ckpt_root": str(shared / "scratch" / sweep),
            "python": sys.executable, "slurm": {"time": "30:00", "grace": 30}},
        configs={f"c{i}": yaml.safe_dump({"lr": 0.1, "hidden": 4, "seed": i, "step_time": 0.1})
                 for i in range(10)},
        work=work,
        train=f"{sys.executable} fault_train.py --config {{cfg}} --epochs {{epochs}} --out {{ckpt_dir}} "
              "--resume {resume} --name {name}",
        artifacts={"checkpoint": fault_train.CKPT, "metrics": "metrics.json", "metrics_keys": ["val_loss"]},
        tasks={"t": {"epochs": 3, "cost_per_epoch": 1.0}},
        cells=[{"glob": "configs/*.yaml", "task": "t"}], heartbeat_secs=1, hosts={"cluster": {"queues": 5}})
    return proj, shared / "fs" / "ablate" / sweep


def sdiag(sb: SlurmBed, reset: bool = False) -> dict[str, int]:
    if reset:
        sb.run("sdiag", "-r")
        return {}
    out = sb.run("sdiag").stdout
    body = out.split("by message type", 1)[1].split("by user", 1)[0]
    return {k: int(v) for k, v in _SDIAG.findall(body) if k in CLIENT_RPCS}


class Runner:
    def __init__(self, sb: SlurmBed, proj: Path, tmp: Path, shimdir: Path, paths: dict[str, Path]) -> None:
        self.sb, self.proj, self.tmp, self.paths = sb, proj, tmp, paths
        self.shimdir = shimdir

    def env(self, version: str, log: Path) -> dict[str, str]:
        return {**self.sb.env(), "NO_COLOR": "1", "RPC_LOG": str(log),
                "PATH": f"{self.shimdir}{os.pathsep}{os.environ['PATH']}",
                "PYTHONPATH": os.pathsep.join([str(self.paths[version]),
                                               *filter(None, [os.environ.get("PYTHONPATH")])])}

    def measure(self, version: str, argv: list[str],
                seconds: float | None = None) -> tuple[dict[str, int], int]:
        """(shim calls by command, slurmctld client RPCs) of one run of `ablate ARGV`."""
        log = self.tmp / f"rpc-{uuid.uuid4().hex[:6]}.log"
        log.touch()
        sdiag(self.sb, reset=True)
        # Run from the temp dir: `-m` puts the cwd first on sys.path (this checkout, from the repo).
        cmd = [sys.executable, "-m", "ablate", "-C", str(self.proj), *argv]
        if seconds is None:
            p = subprocess.run(cmd, env=self.env(version, log), capture_output=True, text=True, timeout=120,
                               stdin=subprocess.DEVNULL, cwd=self.tmp)
            assert p.returncode == 0, (version, argv, p.stdout[-2000:], p.stderr[-2000:])
        else:
            proc = subprocess.Popen(cmd, env=self.env(version, log), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=self.tmp)
            time.sleep(seconds)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 130, (version, proc.returncode, err[-2000:])
        rpcs = sum(sdiag(self.sb).values())
        calls = collections.Counter(log.read_text().split())
        return {c: calls.get(c, 0) for c in COUNTED}, rpcs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--watch-seconds", type=float, default=60.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    reason = slurmbed.missing_requirement(accounting=True)
    if reason:
        sys.exit(f"bench_slurm_rpc: {reason}")
    with tempfile.TemporaryDirectory(prefix="ablate-rpc-") as t, SlurmBed(3, accounting=True) as sb:
        tmp = Path(t)
        paths = {OLD: old_tree(tmp), "this": REPO}
        for v, path in paths.items():  # each version is the one that runs
            where = subprocess.run([sys.executable, "-c", "import ablate; print(ablate.__file__)"], cwd=tmp,
                                   env={**os.environ, "PYTHONPATH": str(path)}, capture_output=True,
                                   text=True, check=True).stdout
            assert where.startswith(str(path)), (v, where)
        proj, root = project(sb, tmp)
        r = Runner(sb, proj, tmp, shims(tmp), paths)
        env = {**sb.env(), "NO_COLOR": "1"}
        for argv in (["plan"], ["launch", "--all"]):
            subprocess.run([sys.executable, "-m", "ablate", "-C", str(proj), *argv], env=env, check=True,
                           capture_output=True, timeout=300)

        def running() -> int:
            return sum(1 for j in sb.squeue() if j["state"] == "RUNNING")

        assert wait_until(lambda: running() >= 3, 120), sb.squeue()
        queue = sorted(p.stem for p in (proj / "queues").glob("*.txt"))[-1]
        subprocess.run([sys.executable, "-m", "ablate", "-C", str(proj), "stop", queue, "--host", "cluster"],
                       env=env, check=True, capture_output=True, timeout=300)
        per: dict[str, list[tuple[dict[str, int], int]]] = {v: [] for v in paths}
        for i in range(args.reps):
            for v in (list(paths) if i % 2 == 0 else list(reversed(paths))):
                per[v].append(r.measure(v, ["status", "--json"]))
        watch = {v: r.measure(v, ["status", "--watch", "--interval", "2"], args.watch_seconds) for v in paths}
        jobs = sb.squeue()
        sb.run("scancel", *[j["id"] for j in jobs], check=False)
    scale = 60.0 / args.watch_seconds

    def row(label: str, v: str) -> str:
        cells = [median([c[name] for c, _ in per[v]]) for name in ("squeue", "sacct", "sinfo", "sbatch")]
        wc, wr = watch[v]
        wcells = [wc[name] * scale for name in ("squeue", "sacct", "sinfo")]
        return (f"| {label} | {' | '.join(f'{x:g}' for x in cells)} | {median([x for _, x in per[v]]):g} | "
                f"{' | '.join(f'{x:.0f}' for x in wcells)} | {wr * scale:.0f} |")

    lines = ["## Slurm RPCs per status and per minute of --watch", "",
             measured_line(f"python3 scripts/bench_slurm_rpc.py --reps {args.reps} --watch-seconds "
                           f"{args.watch_seconds:g}") + f" ablate {ablate_version()}.", "",
             "One sweep on the Slurm bed with accounting (slurmdbd): 5 queues, 3 jobs RUNNING, 1 "
             "PENDING, one stopped (CANCELLED). Per `ablate status`: calls of each client command (shims "
             f"on PATH; medians of {args.reps}) and slurmctld's client RPCs (`sdiag`; sacct goes to "
             "slurmdbd). Per minute of `status --watch --interval 2`: the same, over "
             f"{args.watch_seconds:g} s scaled to a minute. The old adapter is commit {OLD}'s, run in "
             "the same run on the same sweep.", "",
             "| version | squeue | sacct | sinfo | sbatch | slurmctld RPCs | watch: squeue/min | sacct/min | "
             "sinfo/min | slurmctld RPCs/min |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
             row(f"{OLD} (before)", OLD), row("this checkout", "this"), "",
             f"Jobs at the end: {len(jobs)} ({', '.join(sorted({j['state'] for j in jobs}))}); sweep root "
             f"{root.name}. The new status asks sacct only for a session's recorded last job once squeue has "
             "forgotten it, and keeps its end (`<session>.done`); the stopped queue's job is still listed "
             "(MinJobAge), so it asks none here. --watch asks Slurm at most every `slurm.poll` s (30)."]
    publish("bench_slurm_rpc", lines, not args.no_write)


if __name__ == "__main__":
    main()
