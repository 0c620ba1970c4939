"""What the Slurm tests (tests/test_slurm_*.py) share: the module fixture that points Slurm's
client commands at the bed's controller, and what they read of a sweep's jobs and events
(tests/helpers/slurm_sweep.py: `Sweep`, the sweep on the Slurm bed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.slurm_sweep import Sweep
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed


def slurm_env_fixture() -> Any:
    """A module's `_slurm_env` fixture, which its `pytestmark` puts on every test (usefixtures)."""

    @pytest.fixture(name="_slurm_env")
    def _slurm_env(slurm_cluster: SlurmBed, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        """Slurm's client commands (here and in the jobs, which inherit this environment) talk to the
        bed's controller; every test leaves no job and every node up."""
        monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf_path))
        yield
        slurm_cluster.heal()

    return _slurm_env


def mid_cell(sw: Sweep, min_epoch: int = 1, timeout: float = 120.0) -> tuple[str, dict[str, str]]:
    """(a cell that is training past `min_epoch`, the running job of its queue)."""
    found: list[tuple[str, dict[str, str]]] = []

    def training() -> bool:
        for hb in (sw.root / "heartbeats").glob("cluster.*"):
            data = json.loads(hb.read_text() or "{}")
            cell = data.get("cell")
            if data.get("state") != "running" or not cell or not data.get("cell_started"):
                continue
            epochs = [e["epoch"] for e in sw.trace(cell) if e["ev"] == "epoch"]
            if not epochs or max(epochs) < min_epoch or max(epochs) >= sw.epochs:
                continue
            job = [j for j in sw.jobs()
                   if j["name"].endswith(f"-{data['queue']}") and j["state"] == "RUNNING"]
            if job:
                found.append((cell, job[0]))
                return True
        return False

    wait_for(training, timeout=timeout, interval=0.2)
    return found[-1]


def resumed(sw: Sweep, cell: str) -> list[dict[str, Any]]:
    return [e for e in sw.trace(cell) if e["ev"] == "start" and e["resume"] == 1 and e["start_epoch"] >= 1]


def queue_order(sw: Sweep) -> list[str]:
    """The cells of the one planned queue, in its order."""
    [qf] = sorted((sw.proj / "queues").glob("*.txt"))
    return [Path(ln.split()[0]).stem for ln in qf.read_text().splitlines() if ln.strip()
            and not ln.startswith("#")]


def ev(sw: Sweep, kind: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in sw.events() if e["ev"] == kind and all(e.get(k) == v for k, v in match.items())]
