"""`launch --all` builds its world once (issue 31, "one launch context"): the local queue files are
read once each, the shared-FS object, the roster and the snapshot are built once, each host's
transport once, and the controller lock is entered once, for the whole command with several hosts.
Real tmux (the conftest's private socket), the real tiny trainer, real files; the counts are taken
by wrapping the constructors and functions themselves, wherever a module bound them."""

from __future__ import annotations

import pathlib
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import ablate.cli  # loads what `launch --all` uses, so the wrapping below reaches every module
import ablate.run.launch
import ablate.sweep.cells
import ablate.sweep.lock
from ablate.remote.layout import session_name
from ablate.transport.local import LocalFS, LocalHost
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject, drained

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py


@pytest.fixture(autouse=True)
def _tmux() -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed; the README's test command installs it")


def _wrap_everywhere(monkeypatch: pytest.MonkeyPatch, original: Callable[..., Any],
                     wrapper: Callable[..., Any]) -> None:
    """Replace `original` in every loaded ablate module that bound it (its own module and each
    `from M import name`), so no call path escapes the count."""
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("ablate"):
            for attr, value in list(vars(mod).items()):
                if value is original:
                    monkeypatch.setattr(mod, attr, wrapper)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch, local_project: LocalProject) -> Iterator[Counter[str]]:
    calls: Counter[str] = Counter()
    queues_dir = local_project.root / "queues"
    read_bytes = pathlib.Path.read_bytes

    def counting_read(self: pathlib.Path) -> bytes:
        if self.parent == queues_dir and self.suffix == ".txt":
            calls[f"read queues/{self.name}"] += 1
        return read_bytes(self)

    fs_init, host_init = LocalFS.__init__, LocalHost.__init__

    def counting_fs(self: LocalFS, *args: Any, **kw: Any) -> None:
        calls["shared FS"] += 1
        fs_init(self, *args, **kw)

    def counting_host(self: LocalHost, name: str, *args: Any, **kw: Any) -> None:
        calls[f"transport {name}"] += 1
        host_init(self, name, *args, **kw)

    probe = LocalFS.probe

    def counting_probe(self: LocalFS, op: str, args: Any) -> Any:
        calls[f"probe {op}"] += 1
        return probe(self, op, args)

    lock = ablate.sweep.lock.controller_lock

    def counting_lock(*args: Any, **kw: Any) -> Any:
        calls["controller lock"] += 1
        return lock(*args, **kw)

    roster = ablate.sweep.cells.build_roster

    def counting_roster(*args: Any, **kw: Any) -> Any:
        calls["roster"] += 1
        return roster(*args, **kw)

    monkeypatch.setattr(pathlib.Path, "read_bytes", counting_read)
    monkeypatch.setattr(LocalFS, "__init__", counting_fs)
    monkeypatch.setattr(LocalHost, "__init__", counting_host)
    monkeypatch.setattr(LocalFS, "probe", counting_probe)
    _wrap_everywhere(monkeypatch, lock, counting_lock)
    _wrap_everywhere(monkeypatch, roster, counting_roster)
    yield calls


def test_launch_all_builds_its_world_once(local_project: LocalProject, built: Counter[str],
                                          cli: Cli) -> None:
    lp = local_project
    lp.write_config(hosts={"h1": {"speed": 1.0}, "h2": {"speed": 0.5}, "h3": {"speed": 0.7}})
    queues = {"a": "h1", "b": "h2", "c": "h3", "d": "h1"}
    for q, h in queues.items():
        lp.queue(q, [f"# ablate: host={h}", lp.cfg(f"cfgs/{q}/{q}.yaml") + " recon 1"])
    lp.queue("loose", [lp.cfg("cfgs/x/loose.yaml") + " recon 1"])  # no header: read, not launched

    got = cli.json(lp, "launch", "--all")
    assert [(r["queue"], r["host"], r["status"]) for r in got["launched"]] == [
        (q, h, "launched") for q, h in queues.items()]
    once = {"read queues/a.txt": 1, "read queues/b.txt": 1, "read queues/c.txt": 1, "read queues/d.txt": 1,
            "read queues/loose.txt": 1, "shared FS": 1, "roster": 1, "probe snapshot": 1,
            "transport h1": 1, "transport h2": 1, "transport h3": 1, "controller lock": 1}
    assert dict(built) == once
    for q, h in queues.items():
        drained(lp, h, q)
        assert session_name("t1", h, q) not in LocalHost(h).tmux_sessions()
