"""The fault-injection suite of issue 6 on the 3-instance test bed.

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

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.numpy import load_file

from ablate.transport import close_all
from tests.helpers import fault_train
from tests.helpers.cli import REPO, Cli, CliResult, ablate_process
from tests.helpers.testbed_projects import sshfs_testbed
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

testbed = sshfs_testbed({"test_02_link_drops_mid_queue_and_heals"})

CKPT = fault_train.CKPT
TRAIN = (f"{sys.executable} train.py --config {{cfg}} --epochs {{epochs}} --out {{ckpt_dir}} "
         "--resume {resume} --name {name}")
# Cell states (docs/ARCHITECTURE.md, "Cell states") of a cell with a durable copy, before and
# after a reconcile verified it.
DONE = {"synced", "verified"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


@pytest.fixture
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


# ====================================================================== the scenarios


def test_01_instance_killed_mid_cell(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    victim = "tb-h3"  # the shared FS is read through tb-h1
    cut, unstarted = sw.queues[victim]
    sw.fault(cut, "hang")  # holds it mid-cell, however loaded the machine
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done(victim, cut) >= 1, timeout=30)

    testbed.kill(victim)
    sw.clear(cut, "hang")
    # Unreachable with a fresh heartbeat is not lost: never on one signal.
    assert sw.states()[cut] == "running"
    sw.assert_gate_closed(victim)
    others = [c for c in sw.cells if c not in (cut, unstarted)]
    sw.wait_synced(others)
    # Nothing of it changes any more. Its signs of life are moved back past the staleness floor,
    # max(3 x heartbeat_secs, 30 s), plus the FS's lag, instead of waiting that out.
    sw.age(victim, 40 + sw.lag_allowance())
    sw.wait_states({cut: "lost", unstarted: "never_ran", **{c: DONE for c in others}})

    sw.ok("remediate", "--launch")
    [record] = sw.remediations()
    assert record["cells"] == {cut: "lost", unstarted: "never_ran"}, record
    assert record["queues"] and set(record["queues"].values()) <= {"tb-h1", "tb-h2"}, record
    # The dead host's claim was released on the record, not deleted.
    [released] = list((sw.root / "released").glob(f"{cut}.*"))
    assert json.loads((released / "release.json").read_text())["state"] == "lost"
    assert (released / "owner").read_text().split()[:2] == [victim, victim]
    sw.wait_synced()
    for c in (cut, unstarted):  # re-run elsewhere, from scratch, with the same config
        m = sw.manifest(c)
        assert m["host"] != victim and m["resume"] == 0 and m["cfg"] == sw.cfg(c)
    sw.finish()


def test_02_link_drops_mid_queue_and_heals(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep(steal=True)
    host = "tb-h2"
    first, _ = sw.queues[host]
    sw.fault(first, "hang")  # holds it mid-cell until the link is down
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done(host, first) >= 1, timeout=30)

    testbed.link_down(host)
    st = sw.ok("status")
    assert set(st["unreachable"]) == {host}, st["unreachable"]
    assert st["cells"][first]["state"] == "running"  # not lost: its heartbeat is fresh
    sw.assert_gate_closed(host)
    sw.clear(first, "hang")
    wait_for(lambda: [e for e in sw.evs("end", first) if e["rc"] == 0], timeout=30)  # it goes on
    testbed.link_up(host)

    sw.wait_synced()
    assert all(len(sw.evs("start", c)) == 1 for c in sw.cells)  # nothing re-ran
    sw.ok("remediate")  # nothing lost: nothing to remediate
    assert sw.queue_files() == set(testbed.hosts) and not sw.remediations()
    sw.finish()


def test_03_oom_cell_remediated_after_the_cause_is_fixed(testbed: Testbed,
                                                        sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    bad, after_bad = sw.queues["tb-h2"]
    cfg_sha = sha256(sw.proj / sw.cfg(bad))
    sw.fault(bad, "oom")
    sw.ok("launch", "--all")
    others = [c for c in sw.cells if c != bad]
    sw.wait_synced(others)  # the queue went on past the OOM; the other hosts never noticed
    assert [e["rc"] for e in sw.evs("end", bad)] == [137]
    sw.wait_states({bad: "oom", **{c: DONE for c in others}})
    assert "epoch 1/3" in (sw.root / "tails" / f"{bad}.log").read_text()
    sw.assert_gate_closed("tb-h2")

    sw.clear(bad, "oom")  # the user fixes the cause, not the config
    rem = sw.ok("remediate", "--launch")
    assert [a for a in rem["advice"] if a.startswith(f"oom: {bad}:")], rem["advice"]
    [record] = sw.remediations()
    assert record["cells"] == {bad: "oom"}, record
    [new_queue] = record["queues"]
    lines = [ln for ln in (sw.proj / "queues" / f"{new_queue}.txt").read_text().splitlines()
             if not ln.startswith("#")]
    assert lines == [f"{sw.cfg(bad)} recon"], lines  # the identical queue line
    sw.wait_synced()
    m = sw.manifest(bad)
    assert (m["cfg"], m["task"], m["epochs"], m["cfg_sha256"]) == (sw.cfg(bad), "recon", 3, cfg_sha)
    assert sha256(sw.proj / sw.cfg(bad)) == cfg_sha
    assert sw.manifest(after_bad)["host"] == "tb-h2"
    sw.finish()


def test_04_hung_cell_stopped_and_remediated(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep(monitor={"hung_after": "3s"})
    bad, unstarted = sw.queues["tb-h2"]
    sw.fault(bad, "hang")
    sw.ok("launch", "--all")
    others = [c for c in sw.cells if c not in (bad, unstarted)]
    sw.wait_states({bad: "hung"}, timeout=45)
    sw.assert_gate_closed("tb-h2")
    rem = sw.ok("remediate")  # a hung cell is not re-run while it holds its queue: stop it first
    assert rem["nothing_new"] and not sw.remediations() and bad in rem["hung"], rem
    assert any("ablate stop tb-h2 --host tb-h2" in a for a in rem["advice"]), rem["advice"]

    stopped = sw.ok("stop", "tb-h2", "--host", "tb-h2")
    assert stopped["was_live"] and stopped["signal"] in ("TERM", "KILL"), stopped
    sw.clear(bad, "hang")
    assert not [e for e in sw.evs("end", bad) if e["rc"] == 0]  # cut, not counted done
    sw.wait_synced(others)
    sw.wait_states({bad: "interrupted", unstarted: "never_ran"}, timeout=20)

    sw.ok("remediate", "--launch", "--hosts", "tb-h3")  # onto one host: one queue
    [record] = sw.remediations()
    assert record["cells"] == {bad: "interrupted", unstarted: "never_ran"}, record
    assert list(record["queues"].values()) == ["tb-h3"], record
    assert [p.name.split(".")[0] for p in (sw.root / "released").iterdir()] == [bad]
    sw.finish()


def test_05_sync_to_the_shared_fs_fails(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    host = "tb-h2"
    mine = sw.queues[host]
    (sw.root / "final_ckpts").mkdir(parents=True)
    testbed.read_only(host, f"{testbed.shared_path}/ablate/{sw.name}/final_ckpts")
    sw.ok("launch", "--all")
    others = [c for c in sw.cells if c not in mine]
    sw.wait_synced(others)
    wait_for(lambda: all(sw.evs("end", c) for c in mine), timeout=30)
    for c in mine:
        assert [e["rc"] for e in sw.evs("end", c)] == [3], c
        assert len(sw.evs("sync_failed", c)) == 1
        # The instance-local checkpoint is kept, and it loads.
        assert int(load_file(str(sw.local_ckpt(host, c) / CKPT))["epoch"][0]) == 3
    sw.wait_states({**{c: "sync_failed" for c in mine}, **{c: DONE for c in others}})
    sw.assert_gate_closed(host)

    testbed.writable(host)  # the FS is fixed
    sw.ok("remediate", "--launch", "--hosts", "tb-h1")  # onto one host: one queue
    [record] = sw.remediations()
    assert record["cells"] == {c: "sync_failed" for c in mine}, record
    assert list(record["queues"].values()) == ["tb-h1"], record
    sw.finish(reran=tuple(mine))  # trained on tb-h2 (its copy failed), then again on tb-h1


def test_06_checkpoint_truncated_after_sync(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    sw.ok("launch", "--all")
    sw.wait_synced()
    bad = sw.cells[1]
    durable = sw.root / "final_ckpts" / bad / CKPT
    size = durable.stat().st_size
    with open(durable, "r+b") as f:
        f.truncate(size // 2)

    r = sw.cli("reconcile", "--fs", "--json")
    rec = r.json()
    assert r.code == 1 and not rec["complete"], r.output
    assert [c["name"] for c in rec["corrupt"]] == [bad] and rec["verified"] == len(sw.cells) - 1
    sw.cli("pull")
    r = sw.cli("reconcile")
    assert r.code == 1 and bad in r.output, r.output
    sw.assert_gate_closed("tb-h1")
    sw.wait_states({bad: "corrupt"})

    sw.ok("remediate", "--launch")
    [record] = sw.remediations()
    assert record["cells"] == {bad: "corrupt"}, record
    [aside] = list((sw.root / "final_ckpts").glob(f".aside.{bad}.*"))
    assert (aside / CKPT).stat().st_size == size // 2  # set aside, never deleted
    wait_for(lambda: len([e for e in sw.evs("end", bad) if e["rc"] == 0]) == 2, timeout=60)
    sw.finish(reran=(bad,))


def test_07_wrapper_fix_deployed_mid_run(testbed: Testbed, sweep: Callable[..., Sweep],
                                         tmp_path: Path) -> None:
    sw = sweep(queues=("tb-h1", "tb-h2"))  # tb-h3's queue comes after the fix
    held, _ = sw.queues["tb-h1"]
    sw.fault(held, "hang")  # keeps the old queue live for as long as the test needs
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done("tb-h1", held) >= 1, timeout=30)
    hb = json.loads((sw.root / "heartbeats" / "tb-h1.tb-h1").read_text())
    old_name = hb["run_queue"]
    old_file = sw.root / "wrappers" / old_name
    old_bytes = old_file.read_bytes()
    assert old_name == f"run_queue.{hashlib.sha256(old_bytes).hexdigest()[:12]}.sh"

    # The "fix": an upgraded ablate whose run_queue differs, deployed by a second controller. Laid
    # out as an installed ablate is (setup.cfg maps wrappers/ and profiles/ into the package).
    pkg = tmp_path / "upgraded"
    shutil.copytree(REPO / "ablate", pkg / "ablate", ignore=shutil.ignore_patterns("__pycache__"))
    for d in ("wrappers", "profiles"):
        shutil.copytree(REPO / d, pkg / "ablate" / d, ignore=shutil.ignore_patterns("__pycache__"))
    fixed = old_bytes + b"# a fix, deployed while the old version runs\n"
    (pkg / "ablate" / "wrappers" / "run_queue.sh").write_bytes(fixed)
    dep = sw.run("deploy", "--json", pythonpath=pkg)
    assert dep.returncode == 0, dep.stderr
    new_name = json.loads(dep.stdout)["run_queue"]
    assert new_name != old_name and (sw.root / "wrappers" / new_name).read_bytes() == fixed

    # The live queue keeps reading the old file, byte for byte.
    assert old_file.read_bytes() == old_bytes
    cmdline = Path(f"/proc/{hb['pid']}/cmdline").read_bytes().split(b"\0")
    assert str(old_file).replace(str(testbed.shared_dir), testbed.shared_path).encode() in cmdline
    # New launches use the new one.
    sw.write_queue("tb-h3")
    got = sw.run("launch", "tb-h3", "--host", "tb-h3", "--json", pythonpath=pkg)
    assert got.returncode == 0, got.stderr
    wait_for(lambda: [e for e in sw.evs("queue_start") if e["queue"] == "tb-h3"], timeout=20)
    [start] = [e for e in sw.evs("queue_start") if e["queue"] == "tb-h3"]
    assert start["run_queue"] == new_name

    gc = sw.run("deploy", "--gc", "--json", pythonpath=pkg)
    assert gc.returncode == 1, (gc.stdout, gc.stderr)
    assert ("tb-h1" in gc.stderr or old_name in gc.stderr) and old_file.read_bytes() == old_bytes
    sw.assert_gate_closed("tb-h1")

    sw.clear(held, "hang")
    sw.wait_synced()
    wait_for(lambda: json.loads((sw.root / "heartbeats" / "tb-h1.tb-h1").read_text())["state"] == "drained",
             timeout=20)
    gc = sw.run("deploy", "--gc", "--json", pythonpath=pkg)
    assert gc.returncode == 0, (gc.stdout, gc.stderr)
    assert not old_file.exists() and (sw.root / "wrappers" / new_name).exists()
    old_v, new_v = old_name.split(".")[1], new_name.split(".")[1]
    for c in sw.cells:
        assert sw.manifest(c)["run_queue_version"] == (new_v if c in sw.queues["tb-h3"] else old_v), c
    sw.finish()


def test_08_queue_file_edited_in_the_middle(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    first, second = sw.queues["tb-h2"]
    sw.fault(first, "hang")  # holds it mid-cell until stopped
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done("tb-h2", first) >= 1, timeout=30)
    sw.ok("stop", "tb-h2", "--host", "tb-h2")
    sw.clear(first, "hang")

    qfile = sw.proj / "queues" / "tb-h2.txt"
    original = qfile.read_text()
    lines = original.splitlines(keepends=True)
    gone = next(i for i, ln in enumerate(lines) if ln.startswith(sw.cfg(first)))
    qfile.write_text("".join(lines[:gone] + lines[gone + 1:]))
    ledger = (sw.root / "queues" / "tb-h2.ledger").read_bytes()
    launched = (sw.root / "queues" / "tb-h2.txt").read_bytes()

    r = sw.cli("launch", "tb-h2", "--host", "tb-h2")
    assert r.code == 2, r.output
    assert f"queues/tb-h2.txt:{gone + 1}" in r.output and lines[gone].strip() in r.output, r.output
    assert (sw.root / "queues" / "tb-h2.ledger").read_bytes() == ledger  # nothing changed
    assert (sw.root / "queues" / "tb-h2.txt").read_bytes() == launched
    sw.assert_gate_closed("tb-h2")

    qfile.write_text(original)  # put back: resume is allowed again
    resumed = sw.ok("launch", "tb-h2", "--host", "tb-h2")
    assert resumed["resumed"] and resumed["start_index"] == gone, resumed
    sw.wait_synced()
    assert [e["resume"] for e in sw.evs("start", first)] == [0, 1]
    assert [e["resume"] for e in sw.evs("start", second)] == [0]
    sw.finish()


def test_09_controller_state_deleted_mid_sweep(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    _, held = sw.queues["tb-h1"]
    sw.fault(held, "hang")  # the sweep is still mid-way while the local state goes
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done("tb-h1", held) >= 1, timeout=60)
    sw.ok("pull")
    assert (sw.proj / "results" / sw.name).is_dir()

    shutil.rmtree(sw.proj / "queues")
    shutil.rmtree(sw.proj / "results")
    st = sw.ok("status")
    assert st["roster"] == len(sw.cells)
    assert {r["queue"]: (r["host"], r["cells"]) for r in st["queues"]} == {
        h: (h, cs) for h, cs in sw.queues.items()}
    assert set(st["cells"]) == set(sw.cells)
    sw.assert_gate_closed("tb-h1")

    sw.clear(held, "hang")
    sw.wait_synced()
    rec = sw.ok("reconcile", "--fs")
    assert rec["complete"] and rec["roster"] == rec["verified"] == len(sw.cells), rec
    sw.finish()


def test_10_two_remediations_at_once(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep(queues=("tb-h1", "tb-h2"))
    never = sw.queues["tb-h3"]
    sw.ok("launch", "--all")
    sw.write_queue("tb-h3")  # cells added to the roster, never launched
    ran = [c for c in sw.cells if c not in never]
    sw.wait_synced(ran)
    sw.wait_states({c: "never_ran" for c in never})
    sw.assert_gate_closed("tb-h3")
    before = sw.queue_files()

    procs = [sw.popen("remediate", "--launch", "--json") for _ in range(2)]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        done.append((p.returncode, out, err))
    assert sorted(code for code, _, _ in done)[0] == 0, done
    for code, _, err in done:
        assert code == 0 or (code == 1 and "busy" in err and "held by" in err), done
    recs = sw.remediations()
    assert len(recs) == 1, (recs, [(c, o[-3000:], e[-3000:]) for c, o, e in done])
    [acted] = recs  # one wrote a queue; the other waited and found nothing new
    assert set(acted["cells"]) == set(never) and acted["queues"], acted
    assert sw.queue_files() - before == set(acted["queues"])

    sw.wait_synced()
    assert all(len(sw.evs("start", c)) == 1 for c in never)
    sw.ok("remediate")  # nothing changed since: nothing new
    assert sw.queue_files() - before == set(acted["queues"]) and len(sw.remediations()) == 1
    sw.finish()


def test_11_controller_killed_during_launch_all(testbed: Testbed, sweep: Callable[..., Sweep],
                                                tmp_path: Path) -> None:
    slow, stall = "tb-h3", tmp_path / "stall"
    sw = sweep(steal=True, ssh_extra=testbed.slow_link(slow, 0.2, stall))
    for cells in sw.queues.values():  # the queues that start stay live until the relaunch
        sw.fault(cells[0], "hang")
    ledgers, heartbeats = sw.root / "queues", sw.root / "heartbeats"
    proc = sw.popen("launch", "--all")
    try:
        # launch --all records every queue on the FS before it starts any: from then on the link
        # to `slow` stalls, so its start is in flight when the first queue elsewhere is running.
        wait_for(lambda: (ledgers.is_dir() and any(ledgers.glob("*.ledger"))) or proc.poll() is not None,
                 timeout=90, interval=0.005)
        stall.touch()
        wait_for(lambda: (heartbeats.is_dir() and any(heartbeats.iterdir())) or proc.poll() is not None,
                 timeout=60, interval=0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    time.sleep(0.5)  # a start that had reached its host shows now
    started = {h for h in testbed.hosts if sessions(testbed, h, sw.name)}
    assert started and slow not in started, started  # some started, some not
    sw.assert_gate_closed(sorted(started)[0])

    stall.unlink()
    sw.write_ssh_config()  # the link is well again
    again = sw.ok("launch", "--all")["launched"]
    status = {r["queue"]: r["status"] for r in again}
    assert {h: s for h, s in status.items() if h in started} == dict.fromkeys(started, "running")
    # The killed controller's start to `slow` is still in flight in its ssh connection (OpenSSH's
    # master outlives it) and may land before or during this launch: either one copy starts here
    # or this launch sees that one running; never two (counted below).
    assert {h: s for h, s in status.items() if h not in started} in (
        {slow: "launched"}, {slow: "running"}), (status, started)
    for cells in sw.queues.values():
        sw.clear(cells[0], "hang")
    sw.wait_synced()
    for q in sw.queues:
        assert len([e for e in sw.evs("queue_start") if e["queue"] == q]) == 1, q
    assert all(len(sw.evs("start", c)) == 1 for c in sw.cells)
    sw.finish()


def sessions(tb: Testbed, host: str, sweep: str) -> set[str]:
    """This sweep's tmux sessions on `host`, asked with the real ssh client."""
    # One word: ssh joins its arguments for the remote shell, which would take `#{...}` for a comment.
    p = subprocess.run(tb.ssh_argv(host, shlex.join(["tmux", "ls", "-F", "#{session_name}"])),
                       capture_output=True, text=True, timeout=30, check=False)
    return {s for s in p.stdout.split() if s.startswith(f"ablate-{sweep}-")}


def test_12_instance_reboots_mid_cell_and_resumes(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep(epochs=6)
    host = "tb-h2"
    cut, _ = sw.queues[host]
    sw.fault(cut, "hang", after_epoch=2)  # holds it mid-cell: epochs 1-2 are checkpointed
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done(host, cut) >= 2, timeout=30)

    testbed.reboot(host)  # every process dies; the local disk with the checkpoint dir stays
    at_reboot = int(load_file(str(sw.local_ckpt(host, cut) / CKPT))["epoch"][0])
    assert at_reboot == 2  # the last epoch checkpoint, intact
    sw.clear(cut, "hang")
    sw.assert_gate_closed(host)
    sw.wait_states({cut: "interrupted"}, timeout=45)

    got = sw.ok("launch", host, "--host", host)
    assert got["resumed"] and got["cells"] == 2, got
    sw.wait_synced()
    assert [e["resume"] for e in sw.evs("start", cut)] == [0, 1]
    runs = [e for e in sw.trace(host, cut) if e["ev"] == "start"]
    assert [(r["resume"], r["start_epoch"]) for r in runs] == [(0, 0), (1, at_reboot)], runs
    after = [e["epoch"] for e in sw.trace(host, cut)
             if e["ev"] == "epoch" and e["pid"] == runs[1]["pid"]]
    assert after == list(range(at_reboot + 1, 7)), after  # continued; never restarted at epoch 1
    metrics = json.loads((sw.root / "final_ckpts" / cut / "metrics.json").read_text())
    assert metrics["start_epoch"] == at_reboot and sw.manifest(cut)["resume"] == 1
    sw.finish()


def test_13_storage_outage_mid_queue(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    """The shared FS's server goes away for 20 s while every host is mid-cell (over sshfs, calls
    block and then fail with EIO until it is back): nothing lost, nothing run twice, every cell
    classified truthfully afterwards, and nothing for remediate to do."""
    assert testbed.shared == "sshfs"
    sw = sweep(epochs=3, step_time=0.5)
    firsts = {h: cs[0] for h, cs in sw.queues.items()}
    for c in firsts.values():
        sw.fault(c, "hang")  # every host mid-cell when the outage starts, however loaded the machine
    sw.ok("launch", "--all")
    wait_for(lambda: all(sw.epochs_done(h, c) >= 1 for h, c in firsts.items()), timeout=60)

    testbed.storage_down()
    began = time.monotonic()
    for c in firsts.values():
        sw.clear(c, "hang")  # (the backing dir: the server's own disk, written here)
    # The trainers go on (their checkpoints are on the local disks; the marker reads fail with EIO
    # and count as absent) and finish while the FS is away; then the outage lasts its 20 s.
    wait_for(lambda: all(sw.epochs_done(h, c) == 3 for h, c in firsts.items()), timeout=60)
    wait_for(lambda: time.monotonic() - began >= 20, timeout=30, interval=0.5)
    testbed.storage_up()

    sw.assert_gate_closed("tb-h1")
    sw.wait_synced(timeout=120)
    sw.wait_states(dict.fromkeys(sw.cells, DONE), timeout=60)
    assert sw.ok("remediate")["targets"] == {}
    # The trainers' own record: every cell trained once, to its end, on one host.
    for c in sw.cells:
        runs = [(h, e) for h in testbed.hosts for e in sw.trace(h, c) if e["ev"] == "start"]
        assert len(runs) == 1 and runs[0][1]["resume"] == 0, (c, runs)
        assert len(sw.evs("start", c)) == 1, (c, sw.evs("start", c))
    # The first cells' syncs waited for the FS and went through: no sync failure was recorded.
    assert not sw.evs("sync_failed"), sw.evs("sync_failed")
    sw.finish()


def test_14_default_nfs_like_caches_pass_doctor_and_the_sweep_holds(
        testbed_slowfs: Testbed, tmp_path: Path, cli: Cli) -> None:
    """The shared FS keeps the caches a default NFS mount keeps (sshfs `dcache_timeout=60`, as NFS's
    `acdirmax=60`): doctor passes with its default cap and records a lag of tens of seconds, and a
    sweep with a crashed cell, its remediation and the release gate holds on it (nothing lost,
    nothing run twice), the rules waiting out the measured lag."""
    from ablate.doctor.fs_lag import CAP, LONG

    sw = Sweep(testbed_slowfs, tmp_path, cli, "f14-slowfs")
    try:
        assert sw.doctor is not None, "the bed's first sweep runs doctor"
        assert sw.doctor.code == 0, sw.doctor.output
        lag = sw.doctor.json()["fs_lag"]
        assert lag["ok"] is True and LONG < lag["lag"] < CAP, lag  # real caches, within the cap
        assert all(p["new_file"] is not None and p["append"] is not None for p in lag["pairs"]), lag
        assert "dcache_timeout" in lag["warning"] and "near the cap" not in lag["warning"], lag["warning"]
        assert sw.lag_allowance() >= lag["lag"]

        bad, after_bad = sw.queues["tb-h2"]
        sw.fault(bad, "oom")
        sw.ok("launch", "--all")
        others = [c for c in sw.cells if c != bad]
        sw.wait_synced(others, timeout=300)
        assert [e["rc"] for e in sw.evs("end", bad)] == [137]
        sw.wait_states({bad: "oom", **{c: DONE for c in others}}, timeout=300)
        sw.assert_gate_closed("tb-h2")

        sw.clear(bad, "oom")  # the user fixes the cause
        rem = sw.ok("remediate", "--launch")
        assert [a for a in rem["advice"] if a.startswith(f"oom: {bad}:")], rem["advice"]
        [record] = sw.remediations()
        assert record["cells"] == {bad: "oom"}, record
        sw.wait_synced(timeout=300)
        assert sw.manifest(after_bad)["host"] == "tb-h2"
        sw.finish()
    finally:
        testbed_slowfs.heal()
        sw.close()
