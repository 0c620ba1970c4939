"""A user's project whose one host is a Slurm cluster (tests/slurmbed.py), for the tests that run
sweeps on the real Slurm bed (tests/test_slurm*.py)."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import fault_train
from tests.helpers.cli import Cli
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed


class Sweep:
    """A user's project whose one host is the cluster (`queues: N`), on the bed's shared dir."""

    def __init__(self, sb: SlurmBed, tmp: Path, cli: Cli, *, cells: int, queues: int, epochs: int,
                 step_time: float, slurm: dict[str, Any] | None = None, login: Path | None = None,
                 python: str | None = None, node_local: bool = False,
                 trainer: tuple[Path, str, str] | None = None) -> None:
        """`node_local`: ckpt_root on each node's own disk (`SlurmBed.local_path`), not shared scratch.
        `trainer`: (its file, the arguments after `--out {ckpt_dir} --resume {resume}`, its
        checkpoint entry) in place of the fault suite's trainer."""
        self.sb, self.cli, self.epochs = sb, cli, epochs
        self.sweep = f"s{uuid.uuid4().hex[:6]}"
        shared = sb.shared_dir
        self.proj = tmp / "proj"
        (self.proj / "profiles").mkdir(parents=True)
        self.work = shared / "work" / self.sweep
        self.work.mkdir(parents=True)
        script, args, checkpoint = trainer or (Path(fault_train.__file__), "--epochs {epochs}",
                                               fault_train.CKPT)
        shutil.copyfile(script, self.work / script.name)
        self.scratch = shared / "scratch" / self.sweep
        self.node_local = node_local
        ckpt_root = f"{sb.local_path}/ckpt-{self.sweep}" if node_local else str(self.scratch)
        (self.proj / "profiles" / "cluster.yaml").write_text(yaml.safe_dump({
            "transport": "slurm", "shared_fs": str(shared / "fs"), "ckpt_root": ckpt_root,
            "python": python or sys.executable, "slurm": {"time": "10:00", "grace": 30,
                                                **({"login": "slurm-login"} if login else {}),
                                                **(slurm or {})}}))
        self.cells = [f"c{i}" for i in range(cells)]
        for i, c in enumerate(self.cells):
            body = yaml.safe_dump({"lr": 0.1, "hidden": 4, "seed": i, "step_time": step_time})
            for base in (self.proj, self.work):
                (base / "configs" / f"{c}.yaml").parent.mkdir(parents=True, exist_ok=True)
                (base / "configs" / f"{c}.yaml").write_text(body)
        (self.proj / "ablate.yaml").write_text(yaml.safe_dump({
            "profile": "cluster", "sweep": self.sweep, "workdir": str(self.work),
            "train": f"{sys.executable} {script.name} --config {{cfg}} --out {{ckpt_dir}} "
                     f"--resume {{resume}} {args} --name {{name}}",
            "artifacts": {"checkpoint": checkpoint, **({"pick": "newest"} if trainer else {}),
                          "metrics": "metrics.json", "metrics_keys": ["val_loss"]},
            "tasks": {"t": {"epochs": epochs, "cost_per_epoch": 1.0}},
            "cells": [{"glob": "configs/*.yaml", "task": "t"}],
            "heartbeat_secs": 1,
            **({"ssh_config": str(login)} if login else {}),
            "hosts": {"cluster": {"queues": queues}}}, sort_keys=False))
        self.root = shared / "fs" / "ablate" / self.sweep

    def ok(self, *args: str) -> dict[str, Any]:
        return self.cli.json(self.proj, *args)

    def jobs(self) -> list[dict[str, str]]:
        return [j for j in self.sb.squeue() if self.sweep in j.get("name", "")]

    def published(self) -> set[str]:
        return {p.parent.name for p in (self.root / "final_ckpts").glob("*/MANIFEST.json")}

    def wait_done(self, timeout: float = 240.0) -> None:
        self.wait_until(lambda: self.published() == set(self.cells) and not self.jobs(), timeout=timeout)

    def wait_until(self, cond: Callable[[], object], timeout: float, interval: float = 0.5) -> None:
        """`wait_for`, saying at the deadline what the sweep looks like (`explain`)."""
        try:
            wait_for(cond, timeout=timeout, interval=interval)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.explain()}") from None

    def explain(self) -> str:
        """What the sweep looks like: published cells, jobs, the last events, the jobs' output, and
        what the controller logged last."""
        outs = {p.name: p.read_text()[-1500:] for p in (self.root / "slurm").glob("*.out")}
        try:
            ctld = (self.sb.dir / "slurmctld.log").read_text(errors="replace")[-6000:]
        except OSError as e:
            ctld = str(e)
        return (f"published {sorted(self.published())} of {self.cells}; jobs {self.jobs()}\n"
                f"events: {json.dumps(self.events()[-25:])}\noutputs: {json.dumps(outs, indent=1)}\n"
                f"slurmctld.log's end:\n{ctld}")

    def trace(self, cell: str) -> list[dict[str, Any]]:
        """The trainer's own record of the cell, from every node's disk when ckpt_root is node-local
        (each run's lines where it ran), in time order."""
        dirs = ([self.sb.local_dir(n) / f"ckpt-{self.sweep}" for n in self.sb.nodes] if self.node_local
                else [self.scratch])
        out = []
        for d in dirs:
            path = d / cell / "trace.jsonl"
            if path.exists():
                out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return sorted(out, key=lambda e: e["t"])

    def completed(self, cell: str) -> int:
        """Runs of the trainer that reached the last epoch, by its own record."""
        return sum(1 for e in self.trace(cell) if e["ev"] == "epoch" and e["epoch"] == self.epochs)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for f in sorted((self.root / "events").glob("*.jsonl")):
            out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        return out

    def assert_all_verified_once(self) -> None:
        for c in self.cells:
            assert self.completed(c) == 1, (c, self.trace(c))
        rec = self.ok("reconcile", "--fs")
        assert rec["complete"] is True and rec["verified"] == rec["roster"] == len(self.cells), rec
        assert not list((self.root / "final_ckpts").glob(".staging.*"))
