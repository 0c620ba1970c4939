"""run_queue and run_one against a sweep kept in an object store (a real S3 endpoint: moto's
server), each "instance" with only its own disk: no directory is shared between them. Claims by
conditional create, results visible once committed, events and heartbeats sent to the store, the
credentials handed over a FIFO and written nowhere."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.remote.store.client import Store
from ablate.run.deploy import deploy
from tests.helpers import store_instances
from tests.helpers.project import LocalProject
from tests.helpers.s3 import S3, FaultProxy
from tests.helpers.store_instances import instance, start, store_events
from tests.helpers.wait import wait_for

SECRET = store_instances.SECRET


def test_two_instances_with_no_shared_directory_run_each_cell_once(
        local_project: LocalProject, s3: S3, tmp_path: Path) -> None:
    lp = local_project
    both = lp.cfg("cfgs/a/both.yaml") + " recon 2"
    lp.queue("q1", [both, lp.cfg("cfgs/a/only1.yaml") + " recon 1"])
    lp.queue("q2", [both, lp.cfg("cfgs/a/only2.yaml") + " recon 1"])
    deploy(load_project(lp.root))
    url = s3.url(f"runs/{uuid.uuid4().hex[:8]}/ablate/t1")
    st = Store(url, s3.endpoint)
    for q in ("q1", "q2"):
        st.put(f"queues/{q}.txt", (lp.root / "queues" / f"{q}.txt").read_bytes())
    procs = []
    for host, q in (("h1", "q1"), ("h2", "q2")):
        root = tmp_path / host
        rq, spec = instance(lp, root, host, url, s3.endpoint)
        procs.append(start(rq, spec, q, root))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=180)
        outs.append(out.decode(errors="replace"))
        assert p.returncode == 0, out.decode(errors="replace")

    commits = {o.key.split("/", 1)[1]: json.loads(st.get(o.key).data) for o in st.list("commits/")}  # type: ignore[union-attr]
    assert sorted(commits) == ["both", "only1", "only2"]
    for name, rec in commits.items():
        manifest = st.get(f"results/{name}/{rec['nonce']}/MANIFEST.json")
        assert manifest is not None and json.loads(manifest.data)["name"] == name
        assert st.head(f"results/{name}/{rec['nonce']}/model.safetensors") is not None
    evs = store_events(st)
    assert sorted(evs) == ["events/h1.q1.jsonl", "events/h2.q2.jsonl"]
    starts = Counter(e["cell"] for lines in evs.values() for e in lines if e["ev"] == "start")
    assert starts == {"both": 1, "only1": 1, "only2": 1}
    for lines in evs.values():
        assert lines[0]["ev"] == "queue_start" and lines[-1]["ev"] == "queue_end"
        synced = {e["cell"] for e in lines if e["ev"] == "synced"}
        ended = {e["cell"] for e in lines if e["ev"] == "end"}
        assert synced == ended
    owners = {o.key: st.get(o.key).data.split()[:2] for o in st.list("claims/")}  # type: ignore[union-attr]
    assert len(owners) == 3
    for host, q in (("h1", "q1"), ("h2", "q2")):
        hb = st.get(f"heartbeats/{host}.{q}")
        assert hb is not None and json.loads(hb.data)["state"] == "drained"
    # the secret: in no object of the store, no file of either instance's copy, no output
    for o in st.list(""):
        got = st.get(o.key)
        assert got is not None and SECRET.encode() not in got.data, o.key
    for dirpath, _dirs, files in os.walk(tmp_path):
        for fn in files:
            path = os.path.join(dirpath, fn)
            if os.path.isfile(path) and not os.path.islink(path):
                assert SECRET.encode() not in Path(path).read_bytes(), path
    assert not any(SECRET in o for o in outs)


def test_a_racer_that_loses_the_claim_skips_the_cell(s3: S3, tmp_path: Path) -> None:
    """Four runner processes' agents race for one claim, let go at once: exactly one gets it."""
    from ablate.remote.store.queue_side import Agent

    url = s3.url(f"race/{uuid.uuid4().hex[:8]}/ablate/t1")
    won: list[str] = []
    lock = threading.Lock()
    racers = 4  # each agent's client costs a tenth of a second of CPU; the barrier makes the race
    go = threading.Barrier(racers)

    def racer(i: int) -> None:
        a = Agent(str(tmp_path / f"i{i}"), f"h{i}", "q", url, s3.endpoint)
        go.wait()
        if a.claim("cell", 0, "", "node"):
            with lock:
                won.append(f"h{i}")

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    owner = Store(url, s3.endpoint).get("claims/cell/owner")
    assert owner is not None and owner.data.split()[0].decode() == won[0]


@pytest.fixture(autouse=True)
def _tmux() -> None:
    from tests.helpers.tmux import require_tmux

    require_tmux()


def test_an_instance_killed_mid_upload_leaves_no_committed_result(
        local_project: LocalProject, s3: S3, tmp_path: Path) -> None:
    """The queue's processes killed while the result's checkpoint is on its way to the store (its
    upload held at a proxy): its smaller files are there under the publish's own name, but no
    commit: no reader sees a result, and the cell is left to remediate (claimed, started, never
    ended)."""
    lp = local_project
    train = "sh -c 'mkdir -p {ckpt_dir} && head -c 100000 /dev/urandom > {ckpt_dir}/m.bin' {cfg}"
    lp.write_config(train=train, artifacts={"checkpoint": "m.bin"})
    lp.queue("q1", [lp.cfg("cfgs/a/big.yaml") + " recon 1"])
    deploy(load_project(lp.root))
    url = s3.url(f"kill/{uuid.uuid4().hex[:8]}/ablate/t1")
    st = Store(url, s3.endpoint)
    st.put("queues/q1.txt", (lp.root / "queues" / "q1.txt").read_bytes())
    proxy = FaultProxy(s3.endpoint)
    proxy.stall = "/m.bin"
    rq, spec = instance(lp, tmp_path / "h1", "h1", url, proxy.endpoint)
    p = start(rq, spec, "q1", tmp_path / "h1")
    try:
        assert proxy.stalled.wait(120), "the checkpoint's upload never reached the store"
        wait_for(lambda: any(o.key.endswith("/big.log") for o in st.list("results/big/")), 60)
        assert st.head("commits/big") is None
        os.killpg(p.pid, signal.SIGKILL)
    finally:
        p.communicate(timeout=60)
        proxy.close()
    assert st.head("commits/big") is None
    assert not any(o.key.endswith("/MANIFEST.json") for o in st.list("results/big/"))
    assert not any(o.key.endswith("/m.bin") for o in st.list("results/big/"))
    assert st.get("claims/big/owner") is not None
    evs = store_events(st)["events/h1.q1.jsonl"]
    assert [e["ev"] for e in evs if e.get("cell") == "big"] == ["start"]


def test_a_config_the_instances_clone_lacks_comes_from_the_store(
        local_project: LocalProject, s3: S3, tmp_path: Path) -> None:
    lp = local_project
    cfg = lp.cfg("cfgs/a/only.yaml", seed=7)
    lp.queue("q1", [cfg + " recon 1"])
    deploy(load_project(lp.root))
    url = s3.url(f"cfg/{uuid.uuid4().hex[:8]}/ablate/t1")
    st = Store(url, s3.endpoint)
    st.put("queues/q1.txt", (lp.root / "queues" / "q1.txt").read_bytes())
    st.put(f"cfgs/{cfg}", (lp.root / cfg).read_bytes())
    clone = tmp_path / "clone"  # the instance's clone of the repo: without the config
    clone.mkdir()
    rq, spec = instance(lp, tmp_path / "h1", "h1", url, s3.endpoint, workdir=clone)
    p = start(rq, spec, "q1", tmp_path / "h1")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out.decode(errors="replace")
    assert (clone / cfg).read_bytes() == (lp.root / cfg).read_bytes()
    commit = st.get("commits/only")
    assert commit is not None
    manifest = st.get(f"results/only/{json.loads(commit.data)['nonce']}/MANIFEST.json")
    assert manifest is not None
    assert json.loads(manifest.data)["cfg_sha256"] == hashlib.sha256((lp.root / cfg).read_bytes()).hexdigest()


def test_events_and_heartbeats_reach_the_store_while_the_cell_trains(
        local_project: LocalProject, s3: S3, tmp_path: Path) -> None:
    """Not only at the queue's end: a cell's `start` and a heartbeat naming it are in the store
    while it trains (what status and remediate read when the instance dies mid-cell)."""
    lp = local_project
    gate = tmp_path / "trained"  # the cell trains until the test has seen it in the store
    lp.write_config(train=f"while [ ! -e {gate} ]; do sleep 0.05; done; "
                          "mkdir -p {ckpt_dir} && cp {cfg} {ckpt_dir}/m.bin",
                    artifacts={"checkpoint": "m.bin"})
    lp.queue("q1", [lp.cfg("cfgs/a/slow.yaml") + " recon 1"])
    deploy(load_project(lp.root))
    url = s3.url(f"live/{uuid.uuid4().hex[:8]}/ablate/t1")
    st = Store(url, s3.endpoint)
    st.put("queues/q1.txt", (lp.root / "queues" / "q1.txt").read_bytes())
    rq, spec = instance(lp, tmp_path / "h1", "h1", url, s3.endpoint)
    p = start(rq, spec, "q1", tmp_path / "h1")
    try:
        def started() -> bool:
            evs = store_events(st).get("events/h1.q1.jsonl", [])
            hb = st.get("heartbeats/h1.q1")
            return any(e["ev"] == "start" and e["cell"] == "slow" for e in evs) and hb is not None \
                and json.loads(hb.data)["cell"] == "slow"

        wait_for(started, timeout=60, interval=0.2)
        assert p.poll() is None  # still training
    finally:
        gate.touch()
        out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out.decode(errors="replace")


def test_two_queues_of_one_instance_share_its_copy_and_lose_no_event(
        local_project: LocalProject, s3: S3, tmp_path: Path) -> None:
    """One queue per GPU: both queues' runner processes keep the same copy in step with the store;
    neither sync replaces the other queue's events file or heartbeat under it: every line of both
    reaches the store, once, in order."""
    lp = local_project
    lp.write_config(train="sleep 0.4 && mkdir -p {ckpt_dir} && cp {cfg} {ckpt_dir}/m.bin",
                    artifacts={"checkpoint": "m.bin"})
    for q in ("q1", "q2"):
        lp.queue(q, [lp.cfg(f"cfgs/{q}/{q}c{i}.yaml") + " recon 1" for i in range(4)])
    deploy(load_project(lp.root))
    url = s3.url(f"gpus/{uuid.uuid4().hex[:8]}/ablate/t1")
    st = Store(url, s3.endpoint)
    for q in ("q1", "q2"):
        st.put(f"queues/{q}.txt", (lp.root / "queues" / f"{q}.txt").read_bytes())
    root = tmp_path / "h1"
    rq, spec = instance(lp, root, "h1", url, s3.endpoint)
    procs = [start(rq, spec, q, root) for q in ("q1", "q2")]
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out.decode(errors="replace")
    evs = store_events(st)
    for q in ("q1", "q2"):
        local = [json.loads(x) for x in (root / "events" / f"h1.{q}.jsonl").read_text().splitlines()]
        assert evs[f"events/h1.{q}.jsonl"] == local  # every line, once, in order
        assert [e["cell"] for e in local if e["ev"] == "start"] == [f"{q}c{i}" for i in range(4)]
        hb = st.get(f"heartbeats/h1.{q}")
        assert hb is not None and json.loads(hb.data)["state"] == "drained"
    assert len(st.list("commits/")) == 8
