"""Small real projects on the local transport (real configs, the real tiny trainer, real
checkpoints), written the way a user would write them, and what their shared FS and tmux say."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import ablate.demo.train as demo_train
from ablate.errors import AblateError, ConfigError
from ablate.remote.layout import session_name
from ablate.transport.local import LocalHost
from tests.helpers.wait import wait_for

# libyaml's emitter when PyYAML has it: the same text as yaml.safe_dump's (checked on every config the
# suite writes), five times faster; a test writes a config or two, the suite thousands.
DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def yaml_text(data: object, sort_keys: bool = True) -> str:
    """`yaml.safe_dump(data, sort_keys=sort_keys)`."""
    return str(yaml.dump(data, Dumper=DUMPER, sort_keys=sort_keys))


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
        path.write_text(yaml_text(self.config(**overrides), sort_keys=False))
        return path

    def cfg(self, rel: str, **values: object) -> str:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"lr": 0.1, "hidden": 4, "seed": 1}
        body.update(values)
        path.write_text(yaml_text(body))
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


def events(lp: LocalProject, host: str, queue: str) -> list[dict[str, Any]]:
    """The queue's events file on the shared FS (empty before its first event)."""
    path = lp.shared / "events" / f"{host}.{queue}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def live(host: str, queue: str) -> bool:
    """Is the queue's tmux session (sweep t1) alive on the test's private tmux server?"""
    return session_name("t1", host, queue) in LocalHost(host).tmux_sessions()


def drained(lp: LocalProject, host: str, queue: str, since: int = 0) -> list[dict[str, Any]]:
    """Wait until the queue's session is gone with a `queue_end` after event `since`; its events."""
    def done() -> list[dict[str, Any]] | None:
        evs = events(lp, host, queue)
        return evs if not live(host, queue) and any(e["ev"] == "queue_end" for e in evs[since:]) else None

    # A deadline, not a time: a queue of real framework trainers (transformers, lightning) takes
    # 25 s alone here, and CI at d712ea7 under a load of 10-15 missed 30 s once.
    result = wait_for(done, timeout=180)
    assert isinstance(result, list)
    return result


def refused(p: LocalProject, *needles: str, exc: type[AblateError] = ConfigError) -> str:
    """`load_project` refuses the project: `exc`, exit 2, a one-line message naming each needle."""
    from ablate.config.project import load_project

    with pytest.raises(exc) as ei:
        load_project(p.root)
    assert ei.value.exit_code == 2
    msg = ei.value.message
    assert "\n" not in msg, "one-line messages"
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg
