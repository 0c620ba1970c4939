"""A sweep kept in an object store, on three real instances that share NO directory (the test bed's
`shared="none"`: real sshd, real tmux, each with only its own disk and its own clone of the repo),
the store a real S3 endpoint (moto's server) on the bed's bridge, driven through `ablate.cli.main`:
the whole flow to release; a crash and remediate; an instance killed mid-cell; doctor refusing a
store that ignores conditional writes; and the controller's secret key written nowhere."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ablate.remote.store.client import Store
from ablate.transport import close_all
from tests.helpers.cli import Cli, ablate_process
from tests.helpers.s3 import CREDS, S3, FaultProxy, moto_s3
from tests.helpers.store_instances import store_events
from tests.helpers.testbed_projects import CKPT, store_project
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

SECRET = "bed-sentinel-" + uuid.uuid4().hex
FAULT_TRAIN = Path(__file__).parent / "helpers" / "fault_train.py"


@pytest.fixture(scope="module")
def bed_s3(testbed_nofs: Testbed) -> Iterator[S3]:
    """moto's S3 server on the bed's bridge address: every instance reaches it, none shares a file."""
    with moto_s3(ip=testbed_nofs.gateway) as s3:
        yield s3


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's AWS chain: its environment, with a secret key to look for afterwards."""
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)


def project(tb: Testbed, tmp_path: Path, s3: S3, sweep: str, cells: int, epochs: int = 2,
            step_time: float = 0.3, train: str | None = None) -> tuple[Path, Store]:
    url = s3.url(f"bed-{uuid.uuid4().hex[:8]}")
    train = train or (f"{shutil.which('python3') or 'python3'} fault_train.py --config {{cfg}} "
                      "--epochs {epochs} --out {ckpt_dir} --resume {resume} --name {name}")
    proj = store_project(tb, tmp_path, sweep, url, s3.endpoint, cells=cells, epochs=epochs,
                         step_time=step_time, train=train)
    for h in tb.hosts:
        shutil.copyfile(FAULT_TRAIN, tb.local_dir(h) / "repo" / sweep / "fault_train.py")
    return proj, Store(f"{url}/ablate/{sweep}", s3.endpoint)


def fault(tb: Testbed, sweep: str, cell: str, kind: str, body: str = "",
          hosts: list[str] | None = None) -> None:
    for h in hosts or tb.hosts:
        d = tb.local_dir(h) / "repo" / sweep / "faults"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{cell}.{kind}").write_text(body)


def clear_faults(tb: Testbed, sweep: str) -> None:
    for h in tb.hosts:
        shutil.rmtree(tb.local_dir(h) / "repo" / sweep / "faults", ignore_errors=True)


def states(cli: Cli, proj: Path) -> dict[str, str]:
    st = cli.json(proj, "status")
    return {c["cell"]: c["state"] for c in st.get("cells", [])} if "cells" in st else {}


def no_secret_anywhere(tb: Testbed, st: Store, proj: Path, outputs: list[str]) -> None:
    needle = SECRET.encode()
    for o in st.list(""):
        got = st.get(o.key)
        assert got is not None and needle not in got.data, o.key
    for base in [tb.local_dir(h) for h in tb.hosts] + [proj]:
        for dirpath, _dirs, files in os.walk(base):
            for fn in files:
                path = os.path.join(dirpath, fn)
                if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) < 50 << 20:
                    with open(path, "rb") as f:
                        assert needle not in f.read(), path
    for text in outputs:
        assert SECRET not in text
    for h in tb.hosts:  # the panes' commands and the tmux servers' environments
        for args in (["list-panes", "-a", "-F", "#{pane_start_command}"], ["show-environment", "-g"]):
            r = subprocess.run(tb.ssh_argv(h, "tmux", *args), capture_output=True, text=True, timeout=30)
            assert SECRET not in r.stdout + r.stderr


def test_whole_flow_with_no_shared_directory(testbed_nofs: Testbed, bed_s3: S3, tmp_path: Path,
                                              cli: Cli, creds: None) -> None:
    tb, sweep = testbed_nofs, "nofs"
    proj, st = project(tb, tmp_path, bed_s3, sweep, cells=6)
    absent = f"configs/{sweep}/c5.yaml"  # no instance's clone has it: launch's copy in the store serves
    for h in tb.hosts:
        (tb.local_dir(h) / "repo" / sweep / absent).unlink()
    outputs: list[str] = []
    try:
        r = cli(proj, "doctor")
        outputs.append(r.output)
        assert r.code == 0, r.output
        plan = cli.json(proj, "plan")
        queue_host = {q["queue"]: q["host"] for q in plan["queues"]}
        r = cli(proj, "deploy")
        outputs.append(r.output)
        assert r.code == 0, r.output
        assert st.get("DEPLOYED.json") is not None
        r = cli(proj, "launch", "--all", "--json")
        outputs.append(r.output)
        assert r.code == 0, r.output
        launched = json.loads(r.out)["launched"]
        assert {(x["queue"], x["host"], x["status"]) for x in launched} == {
            (q, h, "launched") for q, h in queue_host.items()}

        def finished() -> bool:
            s = cli.json(proj, "status")
            return all(q["state"] == "drained" and q["synced"] == q["total"] for q in s["queues"])

        wait_for(finished, timeout=180, interval=1.0)
        views = cli.json(proj, "status")["views"]
        assert set(views) == set(tb.hosts) and all(v["through"] == "store" and v["max_age"] == 0
                                                  for v in views.values()), views
        commits = [o.key for o in st.list("commits/")]
        assert len(commits) == 6
        starts: dict[str, int] = {}
        for o in st.list("events/"):
            got = st.get(o.key)
            assert got is not None
            for line in got.data.decode().splitlines():
                e = json.loads(line)
                if e["ev"] == "start":
                    starts[e["cell"]] = starts.get(e["cell"], 0) + 1
        assert sorted(starts.values()) == [1] * 6
        c5 = st.get("commits/c5")
        assert c5 is not None and st.get(f"cfgs/{absent}") is not None
        ran_c5 = json.loads(c5.data)["host"]
        for h in tb.hosts:
            fetched = (tb.local_dir(h) / "repo" / sweep / absent)
            assert fetched.exists() == (h == ran_c5), h
        # no directory shared: each instance's copy of the sweep is its own, on its own disk
        for h in tb.hosts:
            assert (tb.local_dir(h) / "ckpt" / sweep / ".ablate" / sweep / "wrappers").is_dir()
        on_store = cli.json(proj, "reconcile", "--fs")  # verified by load where they are
        assert on_store["complete"] and on_store["verified"] == 6 and on_store["corrupt"] == [], on_store
        pulled = cli.json(proj, "pull")
        assert pulled["cells"] == 6 and pulled["failed"] == []
        rec = cli.json(proj, "reconcile")
        assert rec["complete"] and rec["verified"] == rec["roster"] == 6, rec
        for name in (c.split("/", 1)[1] for c in commits):
            assert (proj / "results" / sweep / name / CKPT).stat().st_size > 0
        r = cli(proj, "logs", "c0")  # the durable copy's log, from the store
        outputs.append(r.output)
        assert r.code == 0 and "epoch" in r.out, r.output
        report = cli.json(proj, "report", "--out", str(tmp_path / "report"))
        assert report["states"] == {"verified": 6}, report
        watch = ablate_process(proj, "status", "--watch", "--interval", "0.3")
        try:  # the dashboard without a terminal: its plain table, then Ctrl-C
            assert watch.stdout is not None and watch.stderr is not None
            first = [watch.stdout.readline() for _ in range(4)]
            assert first[0].split()[:4] == ["QUEUE", "HOST", "STATE", "K/N"], first
            assert {ln.split()[0] for ln in first[1:]} == set(queue_host), first
            watch.send_signal(signal.SIGINT)
            assert watch.wait(timeout=30) == 130
            err = watch.stderr.read()
            outputs.append(err)
            assert "Traceback" not in err
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
        for h in tb.hosts:
            released = cli.json(proj, "release", h, "--yes")
            assert released["approved"] and released["host"] == h
        no_secret_anywhere(tb, st, proj, outputs)
    finally:
        close_all()


def test_a_crash_is_remediated(testbed_nofs: Testbed, bed_s3: S3, tmp_path: Path, cli: Cli,
                               creds: None) -> None:
    tb, sweep = testbed_nofs, "nofs-crash"
    proj, st = project(tb, tmp_path, bed_s3, sweep, cells=3)
    fault(tb, sweep, "c1", "oom")
    try:
        cli.json(proj, "plan")
        assert cli(proj, "deploy")[0] == 0
        assert cli(proj, "launch", "--all")[0] == 0

        def settled() -> dict[str, str] | None:
            s = cli.json(proj, "status")
            done = all(q["state"] in ("drained", "stopped") for q in s["queues"])
            return s if done else None

        wait_for(settled, timeout=180, interval=1.0)
        assert st.head("commits/c1") is None
        assert not cli.json(proj, "reconcile", "--fs", code=1)["complete"]
        clear_faults(tb, sweep)
        r = cli(proj, "remediate", "--launch")
        assert r.code == 0, r.output

        def complete() -> bool:
            return st.head("commits/c1") is not None

        wait_for(complete, timeout=180, interval=1.0)
        wait_for(lambda: cli(proj, "reconcile", "--fs", "--json").code == 0, timeout=120, interval=1.0)
        rec = cli.json(proj, "reconcile", "--fs")
        assert rec["complete"] and rec["verified"] == 3
    finally:
        close_all()


def test_a_killed_instance_is_remediated_elsewhere(testbed_nofs: Testbed, bed_s3: S3, tmp_path: Path,
                                                   cli: Cli, creds: None) -> None:
    """An instance killed while its cell trains: its heartbeat goes stale by the store's clock, the
    cell is `lost`, remediate re-runs it on a live host, exactly once more, and that run resumes
    from the durable copy the killed instance's queue had put in the store (no disk is shared)."""
    tb, sweep = testbed_nofs, "nofs-kill"
    proj, st = project(tb, tmp_path, bed_s3, sweep, cells=3, epochs=3)
    plan = cli.json(proj, "plan")
    victim_q = plan["queues"][0]
    victim, held = victim_q["host"], victim_q["cells"][0]
    fault(tb, sweep, held, "hang", "1", hosts=[victim])  # holds the cell mid-way on its host
    try:
        assert cli(proj, "deploy")[0] == 0
        assert cli(proj, "launch", "--all")[0] == 0

        def cell_state() -> str:
            return str(cli.json(proj, "status")["cells"][held]["state"])

        def started_in_store() -> bool:  # its heartbeat (a file) may reach the store before its events
            obj = st.get(f"events/{victim}.{victim_q['queue']}.jsonl")
            evs = [json.loads(x) for x in obj.data.decode().splitlines()] if obj is not None else []
            return any(e["ev"] == "start" and e.get("cell") == held for e in evs)

        wait_for(lambda: cell_state() == "running" and started_in_store(), timeout=120, interval=0.5)
        # its epoch-1 checkpoint made durable in the store while the cell is held there
        wait_for(lambda: any(o.key.endswith("/RESUME.json") for o in st.list(f"resume/{held}/")),
                 timeout=60, interval=0.5)
        tb.kill(victim)
        wait_for(lambda: cell_state() == "lost", timeout=120, interval=1.0)
        assert st.head(f"commits/{held}") is None
        r = cli(proj, "remediate", "--launch", "--json")
        assert r.code == 0, r.output
        wait_for(lambda: st.head(f"commits/{held}") is not None, timeout=180, interval=1.0)
        wait_for(lambda: cli(proj, "reconcile", "--fs", "--json").code == 0, timeout=120, interval=1.0)
        got = st.get(f"commits/{held}")
        assert got is not None and json.loads(got.data)["host"] != victim
        ran = []
        for o in st.list("events/"):
            data = st.get(o.key)
            assert data is not None
            ran += [json.loads(x)["host"] for x in data.data.decode().splitlines()
                    if json.loads(x)["ev"] == "start" and json.loads(x).get("cell") == held]
        assert ran[0] == victim and len(ran) == 2 and ran[1] != victim, ran  # its start was in the store
        restored = [e for lines in store_events(st).values() for e in lines
                    if e["ev"] == "restore" and e.get("cell") == held]
        said = [(e["host"], e["from"], e["made_on"]) for e in restored]
        assert said == [(ran[1], "copy", victim)], restored
        assert not st.list(f"resume/{held}/"), "a published cell's copies go from the store"
        trace = (tb.local_dir(ran[1]) / "ckpt" / sweep / held / "trace.jsonl").read_text().splitlines()
        assert json.loads(trace[0])["start_epoch"] == 1, trace  # epoch 1 was not trained again
    finally:
        tb.revive(victim)
        close_all()


def test_doctor_refuses_a_store_that_ignores_conditional_writes(
        testbed_nofs: Testbed, bed_s3: S3, tmp_path: Path, cli: Cli, creds: None) -> None:
    tb = testbed_nofs
    deaf = FaultProxy(bed_s3.endpoint, drop={"if-none-match", "if-match"}, ip=tb.gateway)
    try:
        proj, _st = project(tb, tmp_path, S3(deaf.endpoint, bed_s3.bucket), "nofs-deaf", cells=1)
        r = cli(proj, "doctor")
        assert r.code == 1, r.output
        assert "conditional" in r.output and deaf.endpoint in r.output
    finally:
        deaf.close()
        close_all()


def test_append_and_stop_through_the_store(testbed_nofs: Testbed, bed_s3: S3, tmp_path: Path,
                                           cli: Cli, creds: None) -> None:
    """Mid-flight, with each queue's first cell held: a cell appended to one queue (its config in
    no instance's clone) runs after its lines; `stop --after-current` lets another queue's cell
    finish and start nothing more; `stop` ends a third at once and records it in the store."""
    tb, sweep = testbed_nofs, "nofs-ctl"
    proj, st = project(tb, tmp_path, bed_s3, sweep, cells=6)
    plan = cli.json(proj, "plan")
    queues = {q["queue"]: (q["host"], q["cells"]) for q in plan["queues"]}
    (qa, (ha, ca)), (qb, (hb, cb)), (qc, (hc, cc)) = sorted(queues.items())
    for h, cells in ((ha, ca), (hb, cb), (hc, cc)):
        fault(tb, sweep, cells[0], "hang", "1", hosts=[h])
    extra = f"configs/{sweep}/extra.yaml"
    (proj / extra).write_text((proj / f"configs/{sweep}/c0.yaml").read_text().replace("seed: 0", "seed: 99"))
    try:
        assert cli(proj, "deploy")[0] == 0
        assert cli(proj, "launch", "--all")[0] == 0

        def running(cell: str) -> bool:
            return bool(cli.json(proj, "status")["cells"][cell]["state"] == "running")

        wait_for(lambda: all(running(c[0]) for c in (ca, cb, cc)), timeout=120, interval=0.5)
        r = cli(proj, "append", qa, extra, "recon")
        assert r.code == 0, r.output
        r = cli(proj, "stop", qb, "--host", hb, "--after-current")
        assert r.code == 0, r.output
        r = cli(proj, "stop", qc, "--host", hc)
        assert r.code == 0, r.output
        clear_faults(tb, sweep)

        def settled() -> bool:
            s = cli.json(proj, "status")
            return all(q["state"] in ("drained", "stopped") for q in s["queues"])

        wait_for(settled, timeout=180, interval=1.0)

        def started(host: str, queue: str) -> list[str | None]:
            got = st.get(f"events/{host}.{queue}.jsonl")
            assert got is not None
            evs = [json.loads(x) for x in got.data.decode().splitlines()]
            return [e.get("cell") for e in evs if e["ev"] in ("start", "queue_stop", "stopped")]

        assert started(ha, qa) == [*ca, "extra"]
        assert started(hb, qb) == [cb[0], None]  # its cell, then queue_stop (after_current)
        assert started(hc, qc)[0] == cc[0] and started(hc, qc)[-1] is None  # `stopped`, by ablate stop
        cells = cli.json(proj, "status")["cells"]
        tail = st.get("tails/extra.log")
        assert cells["extra"]["state"] in ("synced", "verified"), tail and tail.data.decode()[-1500:]
        assert cells[cb[0]]["state"] in ("synced", "verified") and cells[cb[1]]["state"] == "never_ran"
        assert cells[cc[0]]["state"] == "interrupted"
    finally:
        close_all()


def test_a_store_outage_and_throttling_are_waited_out(testbed_nofs: Testbed, bed_s3: S3, tmp_path: Path,
                                                      cli: Cli, creds: None) -> None:
    """The store throttles (503 SlowDown) then goes away for a while as the queues run, then comes
    back: the queues wait for it, as for a shared FS's outage, and every cell ends once, its events
    all in the store."""
    tb, sweep = testbed_nofs, "nofs-outage"
    proxy = FaultProxy(bed_s3.endpoint, ip=tb.gateway)
    try:
        proj, st = project(tb, tmp_path, S3(proxy.endpoint, bed_s3.bucket), sweep, cells=6, step_time=0.5)
        direct = Store(st.url, bed_s3.endpoint)
        cli.json(proj, "plan")
        assert cli(proj, "deploy")[0] == 0
        assert cli(proj, "launch", "--all")[0] == 0
        wait_for(lambda: len(direct.list("commits/")) >= 1, timeout=120, interval=0.5)
        proxy.slowdown = 30  # a burst of 503 SlowDown
        wait_for(lambda: proxy.slowdown == 0, timeout=60, interval=0.2)
        proxy.down()
        seen = proxy.seen
        time.sleep(8.0)  # the outage's length: the fault itself, not a wait for a condition
        proxy.up()
        assert proxy.seen == seen  # nothing reached it while it was down

        last: list[object] = []

        def finished() -> bool:
            s = cli.json(proj, "status")
            last[:] = [s.get("queues")]
            return all(q["state"] == "drained" and q["synced"] == q["total"] for q in s["queues"])

        try:  # (CI24 once: not finished within 240 s; what the queues and the store said is printed)
            wait_for(finished, timeout=240, interval=1.0)
        except AssertionError as e:
            raise AssertionError(f"{e}; the queues: {last}; events: {store_events(st)}") from None
        assert len(direct.list("commits/")) == 6
        ends: dict[str, int] = {}
        for o in direct.list("events/"):
            got = direct.get(o.key)
            assert got is not None
            evs = [json.loads(x) for x in got.data.decode().splitlines()]
            starts = [e["cell"] for e in evs if e["ev"] == "start"]
            assert starts == [e["cell"] for e in evs if e["ev"] == "end"], evs
            for c in starts:
                ends[c] = ends.get(c, 0) + 1
        assert sorted(ends.values()) == [1] * 6
    finally:
        proxy.close()
        close_all()


def test_a_lightning_run_on_a_spot_instance_stopped_with_term_resumes_elsewhere(
        testbed_nofs: Testbed, bed_s3: S3, tmp_path: Path, cli: Cli, creds: None) -> None:
    """A real Lightning run (`ModelCheckpoint(save_last="link")`, `fit(ckpt_path="last")`) on an
    instance of a store sweep that is stopped as RunPod stops a spot pod: SIGTERM to everything
    on it, SIGKILL 5 s later, its disk out of reach. remediate runs the cell on another real
    instance, which restores the store's copy of the newest checkpoint (the link made again) and
    goes on from the next epoch."""
    lightning_resume_train = Path(__file__).parent / "helpers" / "lightning_resume_train.py"  # (not imported)

    tb, sweep = testbed_nofs, "nofs-spot"
    train = (f"{shutil.which('python3') or 'python3'} lightning_resume_train.py --config {{cfg}} "
             "--out {ckpt_dir} --resume {resume} --epochs 5 --name {name}")
    proj, st = project(tb, tmp_path, bed_s3, sweep, cells=1, train=train)
    config = yaml.safe_load((proj / "ablate.yaml").read_text())
    config.update(artifacts={"checkpoint": "ckpts/epoch=*.ckpt", "pick": "newest",
                             "metrics": "metrics.json", "metrics_keys": ["val_loss"]},
                  resume={"checkpoint": ["ckpts/*last*.ckpt"], "pick": "newest"},
                  # the cell runs where it is held: an idle instance once stole it first and ran it
                  # to its end (CI), with nothing ever cut
                  steal=False)
    (proj / "ablate.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for h in tb.hosts:
        shutil.copyfile(lightning_resume_train,
                        tb.local_dir(h) / "repo" / sweep / "lightning_resume_train.py")
    victim = cli.json(proj, "plan")["queues"][0]["host"]
    fault(tb, sweep, "c0", "hold", "2", hosts=[victim])  # held as epoch 2 starts, epoch 1 saved

    def durable() -> bool:
        for o in st.list("resume/c0/"):
            got = st.get(o.key) if o.key.endswith("/RESUME.json") else None
            if got is not None and json.loads(got.data)["links"] == [
                    {"path": "ckpts/last.ckpt", "target": "ckpts/epoch=1-step=8.ckpt"}]:
                return True
        return False

    try:
        assert cli(proj, "deploy")[0] == 0
        assert cli(proj, "launch", "--all")[0] == 0
        # Lightning's first start on a loaded machine takes a minute or more; what the store holds
        # is printed at the deadline.
        try:
            wait_for(durable, timeout=420, interval=0.5)
        except AssertionError as e:
            copies = {o.key: (got.data.decode(errors="replace") if (got := st.get(o.key)) and
                              o.key.endswith("/RESUME.json") else o.size) for o in st.list("resume/c0/")}
            raise AssertionError(f"{e}; the store's copies: {copies}; events: {store_events(st)}") from None
        tb.terminate(victim, grace=5.0)
        wait_for(lambda: cli.json(proj, "status")["cells"]["c0"]["state"] in ("lost", "interrupted"),
                 timeout=120, interval=1.0)
        r = cli(proj, "remediate", "--launch", "--json")
        assert r.code == 0, r.output
        wait_for(lambda: st.head("commits/c0") is not None, timeout=420, interval=1.0)
        got = st.get("commits/c0")
        assert got is not None
        host = json.loads(got.data)["host"]
        assert host != victim
        [restored] = [e for lines in store_events(st).values() for e in lines if e["ev"] == "restore"]
        assert (restored["host"], restored["from"], restored["made_on"]) == (host, "copy", victim), restored
        ckpt = tb.local_dir(host) / "ckpt" / sweep / "c0"
        [run] = [json.loads(x) for x in (ckpt / "trace.jsonl").read_text().splitlines()]
        assert run["resumed"] is True and run["first_epoch"] == 2, run
        assert cli(proj, "reconcile", "--fs", "--json").code == 0
        assert not st.list("resume/c0/"), "a published cell's copies go from the store"
    finally:
        tb.revive(victim)
        close_all()
