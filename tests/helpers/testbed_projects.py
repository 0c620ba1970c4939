"""Projects on the SSH test bed (tests/testbed.py: three real sshd + tmux instances sharing one
directory) as a user would write them, and what the sweep's shared FS records."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import ablate.demo.train as demo_train
from tests.testbed import Testbed, missing_requirement

CKPT = "model.safetensors"
# sys.executable lives outside /tmp (pyenv, /usr): the instances run the controller's Python.
TRAIN_IN_WORKDIR = (f"{sys.executable} train.py --config {{cfg}} --epochs {{epochs}} "
                    "--out {ckpt_dir} --resume {resume}")


def ssh_project(tb: Testbed, tmp_path: Path, sweep: str,
                train: str = "true {cfg} {epochs} {ckpt_dir} {resume}") -> Path:
    """A project on the test bed's three instances (no trainer: `train` is any command)."""
    proj = tmp_path / "proj"
    (proj / "profiles").mkdir(parents=True)
    (proj / "profiles" / "tb.yaml").write_text(yaml.safe_dump({
        "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt"}))
    ssh_config = tb.write_ssh_config(tmp_path / "ssh_config", extra="\nHost *\n  ConnectTimeout 2\n")
    (proj / "ablate.yaml").write_text(yaml.safe_dump({
        "profile": "tb", "sweep": sweep, "workdir": f"{tb.shared_path}/work/{sweep}",
        "train": train,
        "artifacts": {"checkpoint": "m.bin"}, "tasks": {"recon": {"epochs": 1, "cost_per_epoch": 1.0}},
        "budget": {"ckpt_size": "1MB", "scratch": "1MB"}, "ssh_config": str(ssh_config),
        "hosts": {h: {"speed": 1.0} for h in tb.hosts}}, sort_keys=False))
    return proj


def make_project(tb: Testbed, tmp_path: Path, sweep: str, *, cells: int, epochs: int,
                 step_time: float) -> Path:
    """A user's repo on the controller; its configs are also in the workdir on the shared FS, so
    every host trains from the same files the controller plans and reconciles against."""
    proj = tmp_path / "proj"
    (proj / "profiles").mkdir(parents=True)
    (proj / "profiles" / "tb.yaml").write_text(yaml.safe_dump({
        "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt/{sweep}"}))
    work = tb.shared_dir / "work" / sweep
    # The trainer goes into the shared workdir: the instances cannot see the repo when it lives
    # under /tmp (each instance has a private /tmp), as a CI clone may.
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(demo_train.__file__, work / "train.py")
    for i in range(cells):
        rel = f"configs/{sweep}/c{i}.yaml"
        body = yaml.safe_dump({"lr": 0.1, "hidden": 4, "seed": i, "step_time": step_time})
        for base in (proj, work):
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(body)
    _write_config(tb, tmp_path, proj, sweep, f"{tb.shared_path}/work/{sweep}", TRAIN_IN_WORKDIR, epochs)
    return proj


def _write_config(tb: Testbed, tmp_path: Path, proj: Path, sweep: str, workdir: str, train: str,
                  epochs: int) -> None:
    """The ablate.yaml of a bed project: the real trainer over every config of the sweep, on each host."""
    ssh_config = tb.write_ssh_config(tmp_path / "ssh_config", extra="\nHost *\n  ConnectTimeout 2\n")
    (proj / "ablate.yaml").write_text(yaml.safe_dump({
        "profile": "tb", "sweep": sweep, "workdir": workdir, "train": train,
        "artifacts": {"checkpoint": CKPT, "metrics": "metrics.json", "metrics_keys": ["val_loss"]},
        "tasks": {"recon": {"epochs": epochs, "cost_per_epoch": 1.0}},
        "cells": [{"glob": f"configs/{sweep}/*.yaml", "task": "recon"}],
        "budget": {"ckpt_size": "1MB", "scratch": "1MB"},
        "heartbeat_secs": 1, "ssh_config": str(ssh_config),
        "hosts": {h: {"speed": 1.0} for h in tb.hosts}}, sort_keys=False))


def events(tb: Testbed, sweep: str, host: str, queue: str) -> list[dict[str, Any]]:
    """The queue's events file on the test bed's shared FS (empty before its first event)."""
    path = tb.shared_dir / "ablate" / sweep / "events" / f"{host}.{queue}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sshfs_testbed(bind_only: Collection[str] = ()) -> Any:
    """A module's `testbed` fixture that gives its tests the sshfs bed (a real network FS: client
    caches, a storage server), except the tests named in `bind_only`, which need the bind mount
    (a host's link drops while its FS stays up; over sshfs the FS would go with it)."""

    @pytest.fixture(name="testbed")
    def _testbed(testbed: Testbed, request: pytest.FixtureRequest) -> Testbed:
        if request.node.originalname in bind_only:
            return testbed
        bed: Testbed = request.getfixturevalue("testbed_sshfs")
        return bed

    return _testbed


LIVE_BEDS: list[Testbed] = []  # the session's test beds, healed after each test (conftest)


def session_bed(shared: str, sshfs_options: str = "") -> Iterator[Testbed]:
    """A 3-instance bed with that shared FS for the session (skipped with the reason when it cannot
    be built here), in LIVE_BEDS while it lives, torn down at the end whatever happened."""
    reason = missing_requirement(shared)
    if reason:
        pytest.skip(reason)
    tb = Testbed(3, shared=shared, sshfs_options=sshfs_options)
    try:
        tb.start()
        LIVE_BEDS.append(tb)
        yield tb
    finally:
        if tb in LIVE_BEDS:  # both beds may live in one session
            LIVE_BEDS.remove(tb)
        tb.close()


def store_project(tb: Testbed, tmp_path: Path, sweep: str, url: str, endpoint: str, *, cells: int,
                  epochs: int, step_time: float, train: str = TRAIN_IN_WORKDIR) -> Path:
    """A user's repo on the controller for a bed with no shared directory (`Testbed(shared="none")`):
    the sweep kept in the object store at `url`; each instance has its own clone of the repo on its
    own disk (`<local_path>/repo/<sweep>`), as a user clones it on each rented box."""
    proj = tmp_path / "proj"
    (proj / "profiles").mkdir(parents=True)
    (proj / "profiles" / "tb.yaml").write_text(yaml.safe_dump({
        "transport": "ssh", "storage": url, "storage_endpoint": endpoint,
        "ckpt_root": f"{tb.local_path}/ckpt/{sweep}", "python": sys.executable}))
    shutil.copyfile(demo_train.__file__, proj / "train.py")
    for i in range(cells):
        rel = f"configs/{sweep}/c{i}.yaml"
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_text(yaml.safe_dump({"lr": 0.1, "hidden": 4, "seed": i, "step_time": step_time}))
    for h in tb.hosts:  # each instance's own clone
        clone = tb.local_dir(h) / "repo" / sweep
        shutil.rmtree(clone, ignore_errors=True)
        shutil.copytree(proj, clone, ignore=shutil.ignore_patterns("profiles", "ablate.yaml"))
    _write_config(tb, tmp_path, proj, sweep, f"{tb.local_path}/repo/{sweep}", train, epochs)
    return proj
