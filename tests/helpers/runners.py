"""Run_queue processes a test starts by hand (stealing, the shared head), and what they recorded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from ablate.remote.layout import session_name
from ablate.transport.local import LocalHost
from tests.helpers.project import LocalProject, events
from tests.helpers.wait import wait_for


class Runners:
    """run_queue processes started by a test; any still alive at teardown gets its group killed."""

    def __init__(self, lp: LocalProject) -> None:
        self.lp = lp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, host: str, queue: str, start: int = 0, slot: int | None = None,
              gate: Path | None = None, root: Path | None = None,
              prefix: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """Start run_queue of the sweep at `root` (default the project's); with `gate`, only once a
        shared flock on it is granted (`release`); under `prefix` (a command that runs its argv)."""
        root = root or self.lp.shared
        deployed = json.loads((root / "DEPLOYED.json").read_text())
        argv = ["bash", str(root / "wrappers" / deployed["run_queue"]),
                str(root / "specs" / deployed["specs"][host]), queue, str(start)]
        if slot is not None:
            argv.append(str(slot))
        if gate is not None:
            argv = ["flock", "-s", str(gate), *argv]
        argv = [*prefix, *argv]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


def finish(p: subprocess.Popen[bytes], timeout: float = 60) -> str:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def all_events(lp: LocalProject) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted((lp.shared / "events").glob("*.jsonl")):
        out += [json.loads(x) for x in path.read_text().splitlines()]
    return out


def ends(lp: LocalProject) -> Counter[str]:
    """How many times each cell ran to an `end`, over every queue's events."""
    return Counter(e["cell"] for e in all_events(lp) if e["ev"] == "end")


def victim_drained(lp: LocalProject) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        evs = events(lp, "h1", "q1")
        live = session_name("t1", "h1", "q1") in LocalHost("h1").tmux_sessions()
        return evs if not live and any(e["ev"] == "queue_end" for e in evs) else None

    result = wait_for(done, timeout=60)
    assert isinstance(result, list)
    return result


def own_queue(lp: LocalProject, queue: str, lines: list[str]) -> None:
    """A stealer's queue: the local file and its FS copy (what `launch` would place)."""
    path = lp.queue(queue, lines)
    (lp.shared / "queues").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, lp.shared / "queues" / path.name)


def estimates(lp: LocalProject, hosts: list[str], cells: dict[str, int]) -> None:
    text = "# ablate estimates 0 declared\n" + "".join(f"{h}\n" for h in hosts)
    text += "".join(f"cell\t{name}\t{ms}\n" for name, ms in cells.items())
    tmp = lp.shared / ".estimates.tmp"
    tmp.write_text(text)
    tmp.replace(lp.shared / "estimates.tsv")
