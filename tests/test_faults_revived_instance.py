"""A revived instance is fenced (issue 44), on the 3-instance test bed: an instance paused as a Vast.ai
interruptible one is when outbid (every process SIGSTOPped, its link down: `Testbed.pause`) while its
cell trains, the cell called `lost` and re-run elsewhere by `ablate remediate --launch`, then the
instance thawed. Its queue stops the superseded cell within a heartbeat of the thaw (reason
`superseded`, TERM), never publishes it, records it in its events, and `status` shows it for what it
is, not as a failure; whether the remediated copy is still running at the thaw (`taken`), finished
(the sweep complete and verified first: nothing durable changes), or not launched yet (`released` by
remediate: the revived queue goes on with its next line, claimed by nobody). A partition that heals
before any remediation stops nothing, also over sshfs where the FS goes with the link. The pause on
the bind-mounted shared FS, over sshfs (a network FS whose view lags) and on the object store (no
shared directory: tests/test_store_bed.py's harness).

Holding the two copies of the cut cell: the trainer's `hang` marker (tests/helpers/fault_train.py) is
per cell, in the shared workdir, so on a shared FS it holds both copies alike. The paused copy reads
it only once it is thawed; the marker is on at the thaw (re-made for the thaw after the remediated
copy finished), so the revived trainer is still mid-cell when its queue stops it, as a real run with
epochs to go is, and nothing but the fence ends it. On the object store each instance has its own
clone, so each copy has its own marker.

The measured thaw -> `end` times are printed (`-s` shows them); heartbeat_secs is 1 on the bed, the
bound asserted is wide (the machine is shared and loaded)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ablate.remote.store.client import Store
from ablate.transport import close_all
from tests.helpers.cli import Cli
from tests.helpers.faults import DONE, Sweep, sweep_fixture
from tests.helpers.s3 import CREDS, S3, moto_s3
from tests.helpers.testbed_projects import sshfs_testbed, store_project
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

BOUND = 15.0  # seconds from the thaw to the superseded cell's `end` (heartbeat_secs 1: about 1-2 s)
PARTITION = 8.0  # seconds a partition over sshfs lasts (its mount gives up after 15 s)

testbed = sshfs_testbed({"test_a_thawed_while_the_remediated_copy_runs",
                         "test_b_thawed_after_the_remediated_copy_finished",
                         "test_f_thawed_before_any_copy_claimed_it",
                         "test_c_a_partition_that_heals_before_remediation_stops_nothing"})
sweep = sweep_fixture()


@pytest.fixture
def say(capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Print past the CLI's capture (the `cli` fixture captures this process's output)."""

    def out(msg: str) -> None:
        with capsys.disabled():
            print(f"\n[{request.node.name}] {msg}", flush=True)

    return out


@dataclass
class Paused:
    """A paused instance whose cut cell was remediated elsewhere: the copy's host and queue."""

    victim: str
    cut: str
    unstarted: str
    host: str = ""
    queue: str = ""
    paused_at: float = 0.0


def pause_and_remediate(tb: Testbed, sw: Sweep, launch: bool = True) -> Paused:
    """The victim's first cell held mid-way by the hang marker, the instance paused, its cell
    `lost`, remediate --launch; returns once the remediated copy is held at its first epoch (without
    `launch`: once remediate released the claim and wrote its queues, none launched)."""
    victim = "tb-h3"  # the shared FS is read through tb-h1
    p = Paused(victim, sw.queues[victim][0], sw.queues[victim][1])
    sw.fault(p.cut, "hang")
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done(p.victim, p.cut) >= 1, timeout=30)

    tb.pause(p.victim)
    p.paused_at = time.monotonic()
    sw.assert_gate_closed(p.victim)
    others = [c for c in sw.cells if c not in (p.cut, p.unstarted)]
    sw.wait_synced(others)
    # Frozen: nothing of it changes any more. Its signs of life moved back past the staleness floor.
    sw.age(p.victim, 40 + sw.lag_allowance())
    sw.wait_states({p.cut: "lost", p.unstarted: "never_ran", **{c: DONE for c in others}})
    sw.ok("remediate", *(["--launch"] if launch else []))
    [record] = sw.remediations()
    assert record["cells"] == {p.cut: "lost", p.unstarted: "never_ran"}, record
    assert set(record["queues"].values()) <= {"tb-h1", "tb-h2"}, record
    if not launch:
        return p
    p.host, p.queue = copy_started(sw, p)
    return p


def copy_started(sw: Sweep, p: Paused) -> tuple[str, str]:
    """The host and queue of the remediated copy of the cut cell, once it is held at its first epoch."""

    def copy() -> dict[str, Any] | None:
        return next((e for e in sw.evs("start", p.cut) if e["host"] != p.victim), None)

    start = wait_for(copy, timeout=60)
    assert isinstance(start, dict)
    wait_for(lambda: sw.epochs_done(start["host"], p.cut) >= 1, timeout=30)  # held by the same marker
    return start["host"], start["queue"]


def revived_end(sw: Sweep, p: Paused) -> dict[str, Any] | None:
    return next((e for e in sw.evs("end", p.cut) if e["host"] == p.victim), None)


def thaw_until_stopped(tb: Testbed, sw: Sweep, p: Paused, say: Callable[[str], None]) -> dict[str, Any]:
    """Thaw the victim; its `end` of the cut cell, timed from the thaw."""
    assert revived_end(sw, p) is None
    assert sw.epochs_done(p.victim, p.cut) == 1  # frozen all along
    paused_for = time.monotonic() - p.paused_at
    t0 = time.monotonic()
    tb.thaw(p.victim)
    end = wait_for(lambda: revived_end(sw, p), timeout=60, interval=0.05)
    took = time.monotonic() - t0
    say(f"{tb.shared} FS: thaw -> end of {p.cut} on {p.victim}: {took:.2f}s (paused {paused_for:.0f}s; "
        f"end {end})")
    assert isinstance(end, dict)
    assert took < BOUND, (took, end)
    assert end["reason"] == "superseded" and end["rc"] in (143, 137), end  # stopped: TERM (KILL late)
    assert end["away"] >= paused_for - 5, (end, paused_for)  # it says how long it was away
    return end


def assert_superseded(sw: Sweep, p: Paused, how: str, by: str) -> None:
    """The victim's queue stopped the cut cell and says so; status shows it, not as a failure."""
    [end] = [e for e in sw.evs("end", p.cut) if e["host"] == p.victim]
    assert (end["how"], end["by"]) == (how, by), end
    log = (sw.tb.local_dir(p.victim) / "ckpt" / sw.name / f"{p.cut}.log").read_text()
    assert '"reason": "superseded"' in log, log[-2000:]  # the trainer was told why before its TERM
    assert sw.epochs_done(p.victim, p.cut) == 1  # stopped mid-cell, never trained on
    assert not [e for e in sw.evs("synced", p.cut) if e["host"] == p.victim]
    assert not list((sw.root / "final_ckpts").glob(f".staging.{p.cut}.{p.victim}.*"))
    st = sw.ok("status")
    [row] = [r for r in st["queues"] if r["queue"] == p.victim]
    assert row["failed"] == 0, row
    assert [(s["cell"], s["how"], s["by"]) for s in row["superseded"]] == [(p.cut, how, by)], row
    text = sw.cli("status").output
    assert f"{p.victim} on {p.victim} came back: {p.cut} " in text, text
    assert "superseded, not published" in text, text


def assert_remediated_copy_stands(sw: Sweep, p: Paused) -> None:
    m = sw.manifest(p.cut)
    # it went on from the paused box's durable copy when one was made before the pause
    restored = [e for e in sw.evs("restore", p.cut) if e["host"] == p.host and e["from"] == "copy"]
    assert m["host"] == p.host != p.victim and m["resume"] == int(bool(restored)), (m, restored)
    assert m["cfg"] == sw.cfg(p.cut), m
    assert [e["host"] for e in sw.evs("synced", p.cut)] == [p.host]


def run_thawed_while_the_copy_runs(tb: Testbed, sw: Sweep, say: Callable[[str], None]) -> None:
    p = pause_and_remediate(tb, sw)
    thaw_until_stopped(tb, sw, p, say)
    assert_superseded(sw, p, "taken", f"{p.host}/{p.queue}")
    sw.clear(p.cut, "hang")  # the remediated copy trains to its end
    sw.wait_synced()
    assert_remediated_copy_stands(sw, p)
    sw.finish()


def test_a_thawed_while_the_remediated_copy_runs(testbed: Testbed, sweep: Callable[..., Sweep],
                                                 say: Callable[[str], None]) -> None:
    run_thawed_while_the_copy_runs(testbed, sweep(), say)


def test_d_thawed_while_the_remediated_copy_runs_over_sshfs(testbed: Testbed, sweep: Callable[..., Sweep],
                                                            say: Callable[[str], None]) -> None:
    assert testbed.shared == "sshfs"
    run_thawed_while_the_copy_runs(testbed, sweep(), say)


def final_ckpts(sw: Sweep) -> dict[str, str]:
    """Every file under final_ckpts/ (dot dirs too) -> its sha256."""
    base = sw.root / "final_ckpts"
    return {str(f.relative_to(base)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(base.rglob("*")) if f.is_file()}


def test_b_thawed_after_the_remediated_copy_finished(testbed: Testbed, sweep: Callable[..., Sweep],
                                                     say: Callable[[str], None]) -> None:
    sw = sweep()
    p = pause_and_remediate(testbed, sw)
    sw.clear(p.cut, "hang")  # the copy trains to its end; the frozen one cannot read the marker
    sw.wait_synced()
    pulled = sw.ok("pull")
    assert pulled["failed"] == [], pulled
    rec = sw.ok("reconcile")
    assert rec["complete"] is True and rec["verified"] == rec["roster"] == len(sw.cells), rec
    assert_remediated_copy_stands(sw, p)
    before = final_ckpts(sw)
    sw.fault(p.cut, "hang")  # on at the thaw: the revived trainer is mid-cell, only the fence ends it
    thaw_until_stopped(testbed, sw, p, say)
    hb = sw.root / "heartbeats" / f"{p.victim}.{p.victim}"
    wait_for(lambda: json.loads(hb.read_text()).get("state") == "drained", timeout=30)
    sw.clear(p.cut, "hang")
    assert_superseded(sw, p, "taken", f"{p.host}/{p.queue}")
    ran = [e["cell"] for e in sw.events() if e["ev"] == "start" and e["host"] == p.victim]
    assert ran == [p.cut], ran  # its next line was done elsewhere: never started on it
    assert final_ckpts(sw) == before  # no durable result changed
    assert_remediated_copy_stands(sw, p)
    sw.finish()


def test_f_thawed_before_any_copy_claimed_it(testbed: Testbed, sweep: Callable[..., Sweep],
                                            say: Callable[[str], None]) -> None:
    """Remediate released the claim and wrote its queues, none launched yet, as the victim thaws: the
    claim is nobody's but the release record holds our owner line: `released` by remediate. The
    revived queue goes on with its next line, claimed by nobody; the remediate queue, launched
    then, runs the cut cell and skips that one."""
    sw = sweep()
    p = pause_and_remediate(testbed, sw, launch=False)
    thaw_until_stopped(testbed, sw, p, say)
    assert_superseded(sw, p, "released", "remediate")
    wait_for(lambda: [e for e in sw.evs("start", p.unstarted) if e["host"] == p.victim], timeout=30)
    got = sw.ok("remediate", "--launch")  # the queues written before are launched now
    assert got["launched"] and not got["queues"], got
    p.host, p.queue = copy_started(sw, p)
    sw.clear(p.cut, "hang")
    sw.wait_synced()
    assert_remediated_copy_stands(sw, p)
    assert sw.manifest(p.unstarted)["host"] == p.victim  # its next line, nobody else's
    sw.finish()


def partition_that_heals(tb: Testbed, sw: Sweep, say: Callable[[str], None]) -> None:
    """The victim's link drops mid-cell, its processes live on, and comes back before anything was
    remediated: nothing is stopped, the cell trains on and publishes from there, once."""
    host = "tb-h3"
    cut, _ = sw.queues[host]
    sw.fault(cut, "hang")
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done(host, cut) >= 1, timeout=30)
    hb = sw.root / "heartbeats" / f"{host}.{host}"

    down_at = time.monotonic()
    tb.link_down(host)
    beats = {hb.stat().st_mtime}
    st = sw.ok("status")
    assert set(st["unreachable"]) == {host} and st["cells"][cut]["state"] == "running", st
    sw.assert_gate_closed(host)
    if tb.shared == "bind":  # the FS stays: its queue beats on, its fence checks the claim each beat

        def beat_on() -> bool:
            beats.add(hb.stat().st_mtime)
            return len(beats) >= 5

        wait_for(beat_on, timeout=30, interval=0.2)
    else:  # the FS went with the link: the fence's reads get no answer, nothing is concluded. The
        # partition's length is the fault itself, kept below the mount's own give-up (3 x 5 s of
        # server-alive probes), so it is a partition, not a storage outage.
        cut_off = hb.stat().st_mtime
        time.sleep(max(0.0, down_at + PARTITION - time.monotonic()))
        assert hb.stat().st_mtime == cut_off  # not a beat got through: its FS was cut off too
    say(f"{tb.shared} FS: the partition lasted {time.monotonic() - down_at:.1f}s")
    tb.link_up(host)
    sw.clear(cut, "hang")

    sw.wait_synced()
    assert not [e for e in sw.evs("end") if e.get("reason")], sw.evs("end")  # nothing stopped
    assert all(len(sw.evs("start", c)) == 1 for c in sw.cells)
    assert sw.manifest(cut)["host"] == host
    [row] = [r for r in sw.ok("status")["queues"] if r["queue"] == host]
    assert row["superseded"] == [] and row["failed"] == 0, row
    sw.ok("remediate")
    assert not sw.remediations()
    sw.finish()


def test_c_a_partition_that_heals_before_remediation_stops_nothing(
        testbed: Testbed, sweep: Callable[..., Sweep], say: Callable[[str], None]) -> None:
    partition_that_heals(testbed, sweep(), say)


def test_c_a_partition_that_heals_before_remediation_stops_nothing_over_sshfs(
        testbed: Testbed, sweep: Callable[..., Sweep], say: Callable[[str], None]) -> None:
    assert testbed.shared == "sshfs"
    partition_that_heals(testbed, sweep(), say)


# ---------------------------------------------------------------- the object store (no shared directory)

FAULT_TRAIN = Path(__file__).parent / "helpers" / "fault_train.py"


@pytest.fixture(scope="module")
def bed_s3(testbed_nofs: Testbed) -> Iterator[S3]:
    """moto's S3 server on the bed's bridge address: every instance reaches it, none shares a file."""
    with moto_s3(ip=testbed_nofs.gateway) as s3:
        yield s3


class StoreSweep:
    """A sweep kept in the object store on the bed with no shared directory (as tests/test_store_bed.py
    runs one): each instance has its own clone of the repo, and so its own `faults/` markers."""

    def __init__(self, tb: Testbed, tmp_path: Path, s3: S3, cli: Cli, name: str) -> None:
        self.tb, self.name, self._cli = tb, name, cli
        url = s3.url(f"bed-{uuid.uuid4().hex[:8]}")
        train = (f"{shutil.which('python3') or 'python3'} fault_train.py --config {{cfg}} --epochs "
                 "{epochs} --out {ckpt_dir} --resume {resume} --name {name}")
        self.proj = store_project(tb, tmp_path, name, url, s3.endpoint, cells=6, epochs=3, step_time=0.1,
                                  train=train)
        for h in tb.hosts:
            shutil.copyfile(FAULT_TRAIN, self.clone(h) / "fault_train.py")
        self.store = Store(f"{url}/ablate/{name}", s3.endpoint)
        self.cells = [f"c{i}" for i in range(6)]

    def clone(self, host: str) -> Path:
        return self.tb.local_dir(host) / "repo" / self.name

    def json(self, *args: str) -> dict[str, Any]:
        return self._cli.json(self.proj, *args)

    def fault(self, cell: str, hosts: list[str], on: bool = True) -> None:
        for h in hosts:
            marker = self.clone(h) / "faults" / f"{cell}.hang"
            marker.parent.mkdir(exist_ok=True)
            if on:
                marker.write_text("1\n")
            else:
                marker.unlink(missing_ok=True)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for o in self.store.list("events/"):
            got = self.store.get(o.key)
            out += [json.loads(x) for x in got.data.decode().splitlines() if x.strip()] if got else []
        return out

    def evs(self, kind: str, cell: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["ev"] == kind and e.get("cell") == cell]

    def commit(self, cell: str) -> dict[str, Any] | None:
        got = self.store.get(f"commits/{cell}")
        return json.loads(got.data) if got else None

    def trace(self, host: str, cell: str) -> list[dict[str, Any]]:
        path = self.tb.local_dir(host) / "ckpt" / self.name / cell / "trace.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []

    def epochs_done(self, host: str, cell: str) -> int:
        return max((e["epoch"] for e in self.trace(host, cell) if e["ev"] == "epoch"), default=0)

    def completed(self, cell: str) -> int:
        """Runs of `cell` that reached their last epoch, by the trainers' own records on every disk."""
        return sum(1 for h in self.tb.hosts for e in self.trace(h, cell)
                   if e["ev"] == "epoch" and e["epoch"] == 3)

    def state(self, cell: str) -> str:
        return str(self.json("status")["cells"][cell]["state"])


def test_e_thawed_while_the_remediated_copy_runs_on_the_store(
        testbed_nofs: Testbed, bed_s3: S3, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch,
        say: Callable[[str], None]) -> None:
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    tb = testbed_nofs
    sw = StoreSweep(tb, tmp_path, bed_s3, cli, "nofs-revived")
    plan = sw.json("plan")
    victim = "tb-h3"
    [(queue, [cut, *_])] = [(q["queue"], q["cells"]) for q in plan["queues"] if q["host"] == victim]
    live = [h for h in tb.hosts if h != victim]
    sw.fault(cut, [victim])
    try:
        assert cli(sw.proj, "deploy").code == 0
        assert cli(sw.proj, "launch", "--all").code == 0
        wait_for(lambda: sw.epochs_done(victim, cut) >= 1, timeout=120, interval=0.3)

        tb.pause(victim)
        paused_at = time.monotonic()
        r = cli(sw.proj, "release", victim, "--yes")
        assert r.code == 1 and "refused" in r.output, r.output
        # A store's heartbeat goes stale by the store's clock (it cannot be aged): waited out.
        wait_for(lambda: sw.state(cut) == "lost", timeout=150, interval=1.0)
        sw.fault(cut, live)  # the remediated copy held on its own host, by its own clone's marker
        assert cli(sw.proj, "remediate", "--launch").code == 0

        def copy() -> dict[str, Any] | None:
            return next((e for e in sw.evs("start", cut) if e["host"] != victim), None)

        start = wait_for(copy, timeout=120, interval=0.5)
        assert isinstance(start, dict)
        host, by = start["host"], f"{start['host']}/{start['queue']}"
        wait_for(lambda: sw.epochs_done(host, cut) >= 1, timeout=60, interval=0.3)
        assert sw.epochs_done(victim, cut) == 1

        def revived_end() -> dict[str, Any] | None:
            return next((e for e in sw.evs("end", cut) if e["host"] == victim), None)

        assert revived_end() is None
        paused_for = time.monotonic() - paused_at
        t0 = time.monotonic()
        tb.thaw(victim)
        end = wait_for(revived_end, timeout=60, interval=0.1)
        took = time.monotonic() - t0
        say(f"store: thaw -> end of {cut} on {victim} (in the store): {took:.2f}s "
            f"(paused {paused_for:.0f}s; end {end})")
        assert isinstance(end, dict) and took < BOUND, (took, end)
        assert end["reason"] == "superseded" and end["rc"] in (143, 137), end
        assert (end["how"], end["by"]) == ("taken", by) and end["away"] >= paused_for - 5, end
        log = (tb.local_dir(victim) / "ckpt" / sw.name / f"{cut}.log").read_text()
        assert '"reason": "superseded"' in log, log[-2000:]
        assert sw.epochs_done(victim, cut) == 1
        st = sw.json("status")
        [row] = [r for r in st["queues"] if r["queue"] == queue]
        assert row["failed"] == 0, row
        assert [(s["cell"], s["how"], s["by"]) for s in row["superseded"]] == [(cut, "taken", by)], row
        assert f"{queue} on {victim} came back: {cut} " in cli(sw.proj, "status").output

        sw.fault(cut, live, on=False)  # the remediated copy trains to its end
        wait_for(lambda: all(sw.commit(c) for c in sw.cells), timeout=180, interval=1.0)
        wait_for(lambda: cli(sw.proj, "reconcile", "--fs", "--json").code == 0, timeout=120, interval=1.0)
        commit = sw.commit(cut)
        assert commit is not None and commit["host"] == host, commit
        # none published twice, none ran to its end twice; the superseded run never published
        for c in sw.cells:
            assert len([e for e in sw.evs("end", c) if e["rc"] == 0]) == 1, c
            assert len(sw.evs("synced", c)) == 1, (c, sw.evs("synced", c))
            assert sw.completed(c) == 1, c
        assert [e["host"] for e in sw.evs("synced", cut)] == [host]
        pulled = sw.json("pull")
        assert pulled["failed"] == [], pulled
        rec = sw.json("reconcile")
        assert rec["complete"] and rec["verified"] == rec["roster"] == len(sw.cells), rec
        released = sw.json("release", victim, "--yes")
        assert released["approved"] and released["host"] == victim, released
    finally:
        for h in tb.hosts:
            shutil.rmtree(sw.clone(h) / "faults", ignore_errors=True)
        tb.heal()
        close_all()
