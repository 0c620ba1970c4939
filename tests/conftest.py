"""Shared fixtures: a private tmux server per test, no writes to the real home, and a factory for
small real local projects (real configs, the real tiny trainer, real checkpoints)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

import ablate.demo.train as demo_train


@pytest.fixture(autouse=True)
def _isolate(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test gets its own tmux socket (killed afterwards) and a throw-away HOME."""
    socket = f"ablate-test-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("ABLATE_TMUX_SOCKET", socket)
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    yield socket
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def wait_for(cond: Callable[[], object], timeout: float = 30.0, interval: float = 0.05) -> object:
    """Poll `cond` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {cond}")
        time.sleep(interval)


TRAIN = (
    f"{sys.executable} {demo_train.__file__} --config {{cfg}} --epochs {{epochs}} "
    "--out {ckpt_dir} --resume {resume}"
)


class LocalProject:
    """A throw-away project on the local transport, written the way a user would write it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def config(self, **overrides: object) -> dict[str, object]:
        cfg: dict[str, object] = {
            "profile": "local",
            "sweep": "t1",
            "train": TRAIN,
            "artifacts": {"checkpoint": "model.safetensors", "metrics": "metrics.json",
                          "metrics_keys": ["val_loss"]},
            "tasks": {"recon": {"epochs": 3, "cost_per_epoch": 1.0},
                      "det": {"epochs": 2, "cost_per_epoch": 2.5}},
            "budget": {"ckpt_size": "1MB", "scratch": "1MB"},
            "heartbeat_secs": 1,
            "hosts": {"h1": {"speed": 1.0}, "h2": {"speed": 0.5}},
        }
        cfg.update(overrides)
        return cfg

    def write_config(self, **overrides: object) -> Path:
        path = self.root / "ablate.yaml"
        path.write_text(yaml.safe_dump(self.config(**overrides), sort_keys=False))
        return path

    def cfg(self, rel: str, **values: object) -> str:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"lr": 0.1, "hidden": 4, "seed": 1}
        body.update(values)
        path.write_text(yaml.safe_dump(body))
        return rel

    def queue(self, name: str, lines: list[str]) -> Path:
        path = self.root / "queues" / f"{name}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))
        return path

    @property
    def shared(self) -> Path:
        return self.root / ".ablate" / "shared" / "ablate" / "t1"

    def snapshot(self) -> dict[str, bytes]:
        """Every file under the project (for 'nothing changed on disk' assertions). The controller
        lock's empty lock file is left out: taking the lock to look is not a change of state (its
        holder record is removed on release, and that one would show)."""
        return {str(p.relative_to(self.root)): p.read_bytes()
                for p in sorted(self.root.rglob("*"))
                if p.is_file() and not (p.name == "controller.lock" and p.parent.name == "locks")}


@pytest.fixture
def local_project(tmp_path: Path) -> LocalProject:
    root = tmp_path / "proj"
    root.mkdir()
    p = LocalProject(root)
    p.write_config()
    return p


@pytest.fixture
def tmux_socket() -> str:
    return os.environ["ABLATE_TMUX_SOCKET"]


def require_tmux() -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed; the README's test command installs it")


# --------------------------------------------------------------------------- SSH test bed
from tests.testbed import Testbed, missing_requirement  # noqa: E402


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """Three real sshd+tmux instances sharing one FS (tests/testbed.py); skips when not root or
    a tool is missing. Faults a test injects are undone after it by `_testbed_heal`."""
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    tb = Testbed(3)
    try:
        tb.start()
        _TESTBEDS.append(tb)
        yield tb
    finally:
        _TESTBEDS.clear()
        tb.close()


_TESTBEDS: list[Testbed] = []


@pytest.fixture(autouse=True)
def _testbed_heal() -> Iterator[None]:
    yield
    for tb in _TESTBEDS:
        tb.heal()
