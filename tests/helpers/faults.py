"""The fault-injection suite of issue 6 on the 3-instance test bed (tests/test_faults_*.py): the
sweep each scenario runs (`Sweep`) and the module fixture that makes one per test.

Each scenario runs a small real sweep (a queue of two cells per instance, about a second each,
real safetensors checkpoints from tests/helpers/fault_train.py, copied into the sweep's shared
workdir) across the three instances, injects one fault, drives the recovery through the CLI as a
user would, and ends with the same three assertions (`Sweep.finish`):
  - the roster is 100 % verified: `ablate pull` and `ablate reconcile` exit 0, `complete: true`;
  - no cell ran to completion twice: per cell at most one `end` event with rc 0 and at most one
    `synced` event across all `events/*.jsonl`, and exactly one `final_ckpts/<name>/MANIFEST.json`
    (a scenario names the cells it deliberately re-runs, e.g. a result corrupted after its sync);
  - the teardown gate opened only at the end: `ablate release HOST --yes` exits 1 (and records
    nothing) at the fault, and 0 for that host at the end, recording the approval (no release
    verb is configured).
Cells are held mid-way by the trainer's `hang` marker rather than by timing, so the scenarios
mean the same on a loaded machine.
The in-process CLI (the `cli` fixture) is used where one controller acts; real `python -m ablate`
processes where two controllers race, a controller is killed, or an upgraded ablate is deployed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.transport import close_all
from tests.helpers import fault_train
from tests.helpers.cli import REPO, Cli, CliResult, ablate_process
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

CKPT = fault_train.CKPT
TRAIN = (f"{sys.executable} train.py --config {{cfg}} --epochs {{epochs}} --out {{ckpt_dir}} "
         "--resume {resume} --name {name}")
# Cell states (docs/ARCHITECTURE.md, "Cell states") of a cell with a durable copy, before and
# after a reconcile verified it.
DONE = {"synced", "verified"}

_MEASURED: dict[str, str] = {}  # test bed -> the gate/fslag.json doctor wrote there


class Sweep:
    """One sweep on the test bed: the user's repo on the controller (`proj`), its workdir with
    the trainer and configs on the shared FS, and views of the sweep root through the shared FS's
    backing directory (what every instance sees)."""

    def __init__(self, tb: Testbed, base: Path, cli: Cli, name: str, *,
                 epochs: int = 3, step_time: float = 0.1, steal: bool = False, ssh_extra: str = "",
                 queues: tuple[str, ...] | None = None, **config: Any) -> None:
        self.tb, self._cli, self.name, self.epochs = tb, cli, name, epochs
        self.proj = base / "proj"
        self.work = tb.shared_dir / "work" / name
        self.root = tb.shared_dir / "ablate" / name
        # One queue per host, named after it, two cells each: tb-h1 runs c0 then c1, and so on.
        self.queues = {h: [f"c{2 * i}", f"c{2 * i + 1}"] for i, h in enumerate(tb.hosts)}
        self.cells = [c for cs in self.queues.values() for c in cs]
        (self.proj / "profiles").mkdir(parents=True)
        (self.proj / "profiles" / "tb.yaml").write_text(yaml.safe_dump({
            "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt/{name}"}))
        (self.work / "faults").mkdir(parents=True)
        shutil.copyfile(fault_train.__file__, self.work / "train.py")
        for i, c in enumerate(self.cells):
            rel = self.cfg(c)
            body = yaml.safe_dump({"lr": 0.1, "hidden": 8, "seed": i, "step_time": step_time})
            for where in (self.proj, self.work):
                (where / rel).parent.mkdir(parents=True, exist_ok=True)
                (where / rel).write_text(body)
        self.ssh_config = base / "ssh_config"
        self.refused: set[str] = set()  # hosts whose release was refused mid-sweep
        self.doctor = None  # `ablate doctor --json` when this sweep ran it (the bed's first)
        self.write_ssh_config(ssh_extra)
        (self.proj / "ablate.yaml").write_text(yaml.safe_dump({
            "profile": "tb", "sweep": name, "workdir": f"{tb.shared_path}/work/{name}",
            "train": TRAIN,
            "artifacts": {"checkpoint": CKPT, "metrics": "metrics.json", "metrics_keys": ["val_loss"]},
            "tasks": {"recon": {"epochs": epochs, "cost_per_epoch": 1.0}},
            "budget": {"ckpt_size": "1MB", "scratch": "1MB"},
            "heartbeat_secs": 1, "ssh_config": str(self.ssh_config), "steal": steal,
            "hosts": {h: {"speed": 1.0} for h in tb.hosts}, **config}, sort_keys=False))
        for host in tb.hosts if queues is None else queues:
            self.write_queue(host)
        self.measure_lag()

    def write_queue(self, host: str) -> Path:
        """`queues/<host>.txt` as `ablate plan` would write it (with the `host=` header)."""
        path = self.proj / "queues" / f"{host}.txt"
        path.parent.mkdir(exist_ok=True)
        lines = [f"# ablate: host={host}", *(f"{self.cfg(c)} recon" for c in self.queues[host])]
        path.write_text("".join(ln + "\n" for ln in lines))
        return path

    def cfg(self, cell: str) -> str:
        return f"configs/{self.name}/{cell}.yaml"

    def write_ssh_config(self, extra: str = "") -> None:
        self.tb.write_ssh_config(self.ssh_config, extra="\nHost *\n  ConnectTimeout 2\n" + extra)

    # ------------------------------------------------------------------ the CLI

    def cli(self, *args: str) -> CliResult:
        """One in-process `ablate -C proj ARGS`."""
        return self._cli(self.proj, *args)

    def ok(self, *args: str) -> dict[str, Any]:
        """`ablate ARGS --json`, which must exit 0; its one JSON object. A failure that points at a
        host agent's log brings every instance's (CI keeps nothing of the bed)."""
        r = self._cli(self.proj, *args, "--json")
        logs = self.agent_logs() if r.code != 0 and "host agent logs" in r.out + r.err else {}
        assert r.code == 0, (args, r.code, r.out, r.err, logs)
        return r.json()

    def agent_logs(self) -> dict[str, str]:
        """The end of each instance's host agent logs (why an agent ended a request, or itself)."""
        logs = {}
        for host in self.tb.hosts:
            tail = "tail -n 30 /tmp/ablate-agent-*/*.log 2>&1"
            got = subprocess.run(self.tb.ssh_argv(host, tail), capture_output=True, text=True, timeout=30)
            logs[host] = got.stdout[-3000:]
        return logs

    def popen(self, *args: str, pythonpath: Path = REPO) -> subprocess.Popen[str]:
        """A separate controller process: `python -m ablate -C proj ARGS`, importing ablate from
        `pythonpath` (an upgraded copy of the package, in the wrapper-fix scenario)."""
        return ablate_process(self.proj, *args, pythonpath=pythonpath, cwd=self.proj)

    def run(self, *args: str, pythonpath: Path = REPO) -> subprocess.CompletedProcess[str]:
        p = self.popen(*args, pythonpath=pythonpath)
        out, err = p.communicate(timeout=180)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    # ------------------------------------------------------------------ faults

    def fault(self, cell: str, kind: str, after_epoch: int = 1) -> None:
        """Switch a fault of tests/helpers/fault_train.py on for `cell` (`hang`: after
        `after_epoch`)."""
        (self.work / "faults" / f"{cell}.{kind}").write_text(f"{after_epoch}\n")

    def clear(self, cell: str, kind: str) -> None:
        (self.work / "faults" / f"{cell}.{kind}").unlink()

    # ------------------------------------------------------------------ what the FS holds

    def events(self) -> list[dict[str, Any]]:
        out = []
        for f in sorted((self.root / "events").glob("*.jsonl")):
            out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        return out

    def evs(self, kind: str, cell: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["ev"] == kind and (cell is None or e.get("cell") == cell)]

    def manifests(self) -> set[str]:
        """Cells with a published result (not the `.aside.*` / `.staging.*` dirs)."""
        return {p.parent.name for p in (self.root / "final_ckpts").glob("*/MANIFEST.json")
                if not p.parent.name.startswith(".")}

    def manifest(self, cell: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.root / "final_ckpts" / cell / "MANIFEST.json").read_text())
        return data

    def local_ckpt(self, host: str, cell: str) -> Path:
        """The cell's checkpoint dir on `host`'s instance-local disk (its backing dir here)."""
        return self.tb.local_dir(host) / "ckpt" / self.name / cell

    def trace(self, host: str, cell: str) -> list[dict[str, Any]]:
        """The trainer's own record on `host`'s instance-local disk."""
        path = self.local_ckpt(host, cell) / "trace.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def epochs_done(self, host: str, cell: str) -> int:
        return max((e["epoch"] for e in self.trace(host, cell) if e["ev"] == "epoch"), default=0)

    def remediations(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.root / "remediation").glob("*.json"))]

    def queue_files(self) -> set[str]:
        return {p.stem for p in (self.proj / "queues").glob("*.txt")}

    def wait_synced(self, cells: list[str] | None = None, timeout: float = 90) -> None:
        """Until each cell is published and its run has ended (`synced` comes before `end`)."""
        want = set(cells if cells is not None else self.cells)

        def done() -> bool:
            if not want <= self.manifests():
                return False
            ended = {e["cell"] for e in self.evs("end") if e["rc"] == 0}
            return want <= ended

        wait_for(done, timeout=timeout, interval=0.1)

    # ------------------------------------------------------------------ classification

    def states(self) -> dict[str, str]:
        """Cell -> state from `status --json`'s `cells` map (docs/ARCHITECTURE.md, Cell states); a
        state decided on a view that may be stale is `<state>?` (its `unconfirmed` reason)."""
        return {n: v["state"] + ("?" if v.get("unconfirmed") else "")
                for n, v in self.ok("status")["cells"].items()}

    def wait_states(self, want: dict[str, str | set[str]], timeout: float = 60) -> dict[str, str]:
        seen: dict[str, str] = {}

        def reached() -> bool:
            seen.update(self.states())
            return all(seen.get(c) == s if isinstance(s, str) else seen.get(c) in s
                       for c, s in want.items())

        try:
            wait_for(reached, timeout=timeout, interval=0.3)
        except AssertionError:
            raise AssertionError(f"cell states {want} not reached in {timeout}s; last seen {seen}") from None
        return seen

    def measure_lag(self) -> None:
        """What a user runs first: `ablate doctor`, which measures the FS's visibility lag between
        the hosts and records it (gate/fslag.json). The lag is the FS's, not the sweep's: measured
        once per test bed, and that record copied into each later sweep of the bed."""
        record = self.root / "gate" / "fslag.json"
        if self.tb.rid not in _MEASURED:
            r = self.cli("doctor", "--json")
            assert record.exists(), (r.code, r.output)
            _MEASURED[self.tb.rid] = record.read_text()
            self.doctor: CliResult | None = r
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(_MEASURED[self.tb.rid])

    def lag_allowance(self) -> float:
        """How long the rules wait for the FS to settle (ablate.sweep.views.FsLag)."""
        from ablate.sweep.views import FsLag

        path = self.root / "gate" / "fslag.json"
        return FsLag.from_record(json.loads(path.read_text()) if path.exists() else None).seconds

    def age(self, host: str, seconds: float) -> None:
        """Move back by `seconds` every sign of life `host` left on the FS (its heartbeats' and
        events files' mtimes, the t of its launches in the ledgers), instead of waiting that out."""
        signs = [*(self.root / "heartbeats").glob(f"{host}.*"), *(self.root / "events").glob(f"{host}.*")]
        for path in signs:
            t = path.stat().st_mtime - seconds
            os.utime(path, (t, t))
        for ledger in (self.root / "queues").glob("*.ledger"):
            entries = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
            for e in entries:
                if e.get("host") == host and isinstance(e.get("t"), (int, float)):
                    e["t"] -= seconds
            tmp = ledger.with_name(f".{ledger.name}.tmp")
            tmp.write_text("".join(json.dumps(e) + "\n" for e in entries))
            tmp.replace(ledger)

    # ------------------------------------------------------------------ the gate, the ending

    def assert_gate_closed(self, host: str) -> str:
        """`ablate release HOST --yes` refuses (exit 1) and records nothing; `finish` then
        checks the same host's release goes through."""
        r = self.cli("release", host, "--yes")
        assert r.code == 1 and "refused" in r.output, (r.code, r.output)
        assert not list((self.root / "gate").glob("release.*.json")), "an approval was recorded early"
        self.refused.add(host)
        return r.output

    def finish(self, reran: tuple[str, ...] = ()) -> None:
        """Wait for every cell's durable copy, then the three closing assertions."""
        assert self.refused, "the scenario never checked that the gate was closed"
        self.wait_synced()
        # No cell ran to completion twice (`reran`: re-run on purpose, at most twice).
        for c in self.cells:
            most = 2 if c in reran else 1
            ends = [e for e in self.evs("end", c) if e["rc"] == 0]
            assert 1 <= len(ends) <= most, (c, ends)
            assert 1 <= len(self.evs("synced", c)) <= most, (c, self.evs("synced", c))
        assert self.manifests() == set(self.cells)
        assert not list((self.root / "final_ckpts").glob(".staging.*"))
        # A published cell's resume copies are gone (ablate/remote/resume/copies.py)
        assert not list((self.root / "resume").glob("*/[0-9]*")), list((self.root / "resume").iterdir())
        # Counted apart from our own events: the trainers' own records of a run that reached its
        # last epoch, on every instance's local disk.
        for c in self.cells:
            completed = sum(1 for h in self.tb.hosts for e in self.trace(h, c)
                            if e["ev"] == "epoch" and e["epoch"] == self.epochs)
            assert 1 <= completed <= (2 if c in reran else 1), (c, completed)
        # The roster is 100 % verified, on pulled copies loaded locally.
        pulled = self.ok("pull")
        assert pulled["failed"] == [], pulled
        rec = self.ok("reconcile")
        assert rec["complete"] is True and rec["verified"] == rec["roster"] == len(self.cells), rec
        # Only now does the gate open (no release verb: the approval is recorded).
        for host in sorted(self.refused):
            released = self.ok("release", host, "--yes")
            assert released["approved"] and released["ran"] is None, released
            record = json.loads((self.root / "gate" / f"release.{host}.json").read_text())
            assert record["host"] == host and record["ran"] is None

    def close(self) -> None:
        """Leave nothing running on the instances (a failed scenario may leave a hung cell)."""
        close_all()
        for marker in (self.work / "faults").glob("*"):
            marker.unlink()
        prefix = f"ablate-{self.name}-"
        # One word for the remote shell: ssh joins its arguments with spaces, so `sh -c SCRIPT` as
        # three would run `sh -c tmux` and the rest as that shell's arguments.
        procs = [subprocess.Popen(self.tb.ssh_argv(host, shlex.join(["sh", "-c", (
            f"tmux ls -F '#{{session_name}}' 2>/dev/null | grep '^{prefix}' "
            "| while read -r s; do tmux kill-session -t \"$s\"; done; true")])),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for host in self.tb.hosts]
        for p in procs:
            p.wait(timeout=30)
        shutil.rmtree(self.work, ignore_errors=True)


def sweep_fixture() -> Any:
    """A module's `sweep` fixture: a factory, `sweep(**options)` sets up a fresh `Sweep` on the
    module's `testbed`, named after the test, and closes every one it made after the test."""

    @pytest.fixture(name="sweep")
    def sweep(testbed: Testbed, tmp_path: Path, cli: Cli,
              request: pytest.FixtureRequest) -> Iterator[Callable[..., Sweep]]:
        """A factory: `sweep(**options)` sets up a fresh sweep named after the test."""
        made: list[Sweep] = []

        def make(**options: Any) -> Sweep:
            name = "f" + request.node.name.removeprefix("test_").replace("_", "-")[:22].rstrip("-")
            s = Sweep(testbed, tmp_path, cli, name, **options)
            made.append(s)
            return s

        yield make
        testbed.heal()  # before the clean-up, which needs every instance reachable
        for s in made:
            s.close()

    return sweep
