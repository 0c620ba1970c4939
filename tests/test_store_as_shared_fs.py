"""The controller's shared FS over an object store (`StoreFS`), against a real S3 HTTP endpoint (moto's
server): each SharedFS operation and the key it maps to, immutable creates, racing appends, a claim
released and a result set aside by rename, the controller lock as a lease, the probe over a local
copy (snapshot, verify, report), fetch, errors as FSError; and the whole model (snapshot, hosts,
classification) reading a store a project names."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.errors import FSError, OpFailed
from ablate.remote.layout import SweepLayout, session_name
from ablate.remote.store.client import Store
from ablate.sweep import hostview
from ablate.sweep.classify import classify_state
from ablate.sweep.ledger import prefix_sha256
from ablate.sweep.snapshot import Asked, Snapshot, load
from ablate.transport import shared_fs
from ablate.transport.base import AppendLine, CreateImmutable, Read, Remove, WriteAtomic
from ablate.transport.storefs import StoreFS
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.s3 import CREDS, S3, quick_backoff


def _fs(s3: S3, tmp_path: Path, url: str | None = None, **kw: Any) -> StoreFS:
    url = url or s3.url(f"t/{uuid.uuid4().hex[:8]}/ablate/sw")
    copy = tmp_path / f"copy-{uuid.uuid4().hex[:6]}"
    return StoreFS(url, s3.endpoint, store=Store(url, s3.endpoint, wait=2), copy=str(copy), **kw)


def _commit(st: Store, name: str, files: dict[str, bytes], manifest: dict[str, Any] | None = None) -> str:
    """A result published as run_one's commit does: its files, MANIFEST.json, then the commit."""
    nonce = f"h1.{uuid.uuid4().hex[:12]}"
    for rel, data in files.items():
        st.put(f"results/{name}/{nonce}/{rel}", data)
    raw = json.dumps(manifest if manifest is not None else {"name": name}).encode()
    st.put(f"results/{name}/{nonce}/MANIFEST.json", raw)
    rec = {"nonce": nonce, "manifest_sha256": hashlib.sha256(raw).hexdigest(), "host": "h1", "queue": "q1"}
    assert st.create(f"commits/{name}", json.dumps(rec).encode()) is not None
    return nonce


def test_files_map_to_their_keys(s3: S3, tmp_path: Path) -> None:
    fs = _fs(s3, tmp_path)
    lay = SweepLayout(fs.root)
    assert fs.root.startswith("s3://") and lay.root == fs.root
    assert fs.read_bytes(lay.deployed) is None and not fs.exists(lay.deployed)
    assert fs.listdir(lay.queues) == [] and not fs.remove(lay.queue_file("q1"))

    fs.write_atomic(lay.queue_file("q1"), b"a.yaml recon\n")
    fs.write_atomic(lay.queue_file("q1"), b"a.yaml recon\nb.yaml recon\n")
    fs.write_atomic(lay.stop_request("h1", "q1"), b"{}\n")
    fs.write_atomic(f"{lay.root}/wrappers/sub/deep.sh", b"x")
    assert fs.store.get("queues/q1.txt").data == b"a.yaml recon\nb.yaml recon\n"  # type: ignore[union-attr]
    assert fs.read_bytes(lay.queue_file("q1")) == b"a.yaml recon\nb.yaml recon\n"
    assert fs.listdir(lay.queues) == ["q1.txt"]
    assert fs.listdir(lay.wrappers) == ["sub"] and fs.listdir(lay.root) == ["control", "queues", "wrappers"]
    assert fs.exists(lay.queues) and fs.exists(lay.root) and fs.exists(f"{lay.root}/wrappers/sub")
    assert not fs.exists(f"{lay.root}/wrap")  # a prefix of a name is not a directory

    fs.append_line(lay.ledger("q1"), '{"n": 1}')
    fs.append_line(lay.ledger("q1"), '{"n": 2}\n')
    assert fs.read_bytes(lay.ledger("q1")) == b'{"n": 1}\n{"n": 2}\n'
    assert fs.remove(lay.stop_request("h1", "q1")) and not fs.exists(lay.stop_request("h1", "q1"))

    got = fs.apply([CreateImmutable(f"{lay.specs}/a.env", b"A=1\n"), WriteAtomic(lay.deployed, b"{}"),
                    AppendLine(lay.events_file("h1", "q1"), "{}"), Read(lay.deployed),
                    Remove(lay.deployed), Read(f"{lay.root}/nothing")])
    assert got == [True, None, None, b"{}", True, None]
    with pytest.raises(OpFailed) as ei:
        fs.apply([Read(lay.deployed), CreateImmutable(f"{lay.specs}/a.env", b"B=2\n"),
                  Remove(lay.ledger("q1"))])
    assert ei.value.index == 1 and ei.value.done == [None] and fs.exists(lay.ledger("q1"))

    with pytest.raises(FSError, match="not a path under the sweep's store root"):
        fs.read_bytes("s3://elsewhere/x")


def test_create_immutable_twice_never_overwrites(s3: S3, tmp_path: Path) -> None:
    fs = _fs(s3, tmp_path)
    path = f"{fs.root}/wrappers/run_queue.abc.sh"
    assert fs.create_immutable(path, b"#!/bin/bash\necho one\n") is True
    assert fs.create_immutable(path, b"#!/bin/bash\necho one\n") is False
    with pytest.raises(FSError, match="never overwritten") as ei:
        fs.create_immutable(path, b"#!/bin/bash\necho two\n")
    assert ei.value.via == "store" and ei.value.path == path
    assert fs.read_bytes(path) == b"#!/bin/bash\necho one\n"


def test_appends_racing_from_threads_keep_every_line_once_in_each_writers_order(
        s3: S3, tmp_path: Path) -> None:
    fs = _fs(s3, tmp_path)
    path = SweepLayout(fs.root).events_file("h1", "q1")

    # Four writers of three lines each, let go at once by a barrier: every append races the others'
    # (each retried append reads the object again, so the work grows with the square of the writers).
    writers, each = 4, 3
    mine = [_fs(s3, tmp_path, fs.root) for _ in range(writers)]  # own clients, as other controllers'
    go = threading.Barrier(writers)

    def writer(w: int) -> None:
        go.wait()
        for i in range(each):
            mine[w].append_line(path, json.dumps({"w": w, "i": i}))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = fs.read_bytes(path)
    assert data is not None
    lines = [json.loads(ln) for ln in data.decode().splitlines()]
    assert sorted((d["w"], d["i"]) for d in lines) == [(w, i) for w in range(writers) for i in range(each)]
    for w in range(writers):
        assert [d["i"] for d in lines if d["w"] == w] == list(range(each))


def test_a_claim_is_released_by_rename_to_released(s3: S3, tmp_path: Path) -> None:
    fs = _fs(s3, tmp_path)
    lay = SweepLayout(fs.root)
    fs.store.put("claims/c1/owner", b"h1 q1 0 1700000000.0 - n1\n")
    fs.write_atomic(f"{lay.claim('c1')}/release.json", b'{"state": "crashed"}\n')
    dst = lay.released_claim("c1", "1700000100.000")
    assert fs.rename_noreplace(lay.claim("c1"), dst) is True
    assert fs.listdir(lay.claims) == [] and not fs.exists(lay.claim("c1"))
    assert fs.listdir(lay.released) == ["c1.1700000100.000"]
    assert fs.listdir(dst) == ["owner", "release.json"]
    assert fs.read_bytes(f"{dst}/owner") == b"h1 q1 0 1700000000.0 - n1\n"
    assert fs.rename_noreplace(lay.claim("c1"), dst) is False  # nothing left to rename

    fs.store.put("claims/c1/owner", b"h2 q2 0 1700000200.0 - n2\n")
    with pytest.raises(FSError, match="destination exists") as ei:
        fs.rename_noreplace(lay.claim("c1"), dst)
    assert ei.value.dst == dst and fs.exists(lay.claim_owner("c1"))  # nothing moved


def test_a_committed_result_reads_through_its_commit_and_is_set_aside_by_rename(
        s3: S3, tmp_path: Path) -> None:
    fs = _fs(s3, tmp_path)
    lay = SweepLayout(fs.root)
    assert fs.listdir(lay.final) == [] and not fs.exists(lay.final_dir("c"))
    assert fs.read_bytes(lay.manifest("c")) is None
    nonce = _commit(fs.store, "c", {"best.pt": b"weights", "hf/model.bin": b"shard"}, {"name": "c", "v": 1})
    fs.store.put("results/c/other-nonce/best.pt", b"an upload never committed")

    assert fs.exists(lay.final) and fs.exists(lay.final_dir("c")) and fs.exists(lay.manifest("c"))
    assert fs.listdir(lay.final) == ["c"]
    assert fs.listdir(lay.final_dir("c")) == ["MANIFEST.json", "best.pt", "hf"]
    assert fs.listdir(f"{lay.final_dir('c')}/hf") == ["model.bin"]
    assert json.loads(fs.read_bytes(lay.manifest("c")) or b"") == {"name": "c", "v": 1}
    assert fs.read_bytes(f"{lay.final_dir('c')}/hf/model.bin") == b"shard"
    out = tmp_path / "best.pt"
    seen: list[int] = []
    assert fs.fetch(f"{lay.final_dir('c')}/best.pt", str(out), seen.append) == 7
    assert out.read_bytes() == b"weights" and sum(seen) == 7
    with pytest.raises(FileNotFoundError):
        fs.fetch(f"{lay.final_dir('nope')}/best.pt", str(out))
    with pytest.raises(FileNotFoundError):
        fs.fetch(f"{lay.final_dir('c')}/nope.pt", str(out))
    with pytest.raises(FSError, match="published by its commit"):
        fs.write_atomic(lay.manifest("c"), b"{}")

    dst = lay.aside_dir("c", "1700000000.500")
    assert fs.rename_noreplace(lay.final_dir("c"), dst) is True
    assert not fs.exists(lay.final_dir("c")) and fs.read_bytes(lay.manifest("c")) is None
    assert fs.listdir(lay.final) == [".aside.c.1700000000.500"] and fs.exists(dst)
    assert fs.read_bytes(f"{dst}/best.pt") == b"weights"  # the result set aside still reads
    assert {o.key for o in fs.store.list("results/c/")} >= {f"results/c/{nonce}/best.pt"}  # never deleted
    assert fs.rename_noreplace(lay.final_dir("c"), dst) is False
    assert fs.rename_noreplace(f"{lay.final}/.staging.c.h1.42", lay.aside_dir("c", "1.000", 1)) is False

    _commit(fs.store, "c", {"best.pt": b"again"})  # re-run, published again
    with pytest.raises(FSError, match="destination exists"):
        fs.rename_noreplace(lay.final_dir("c"), dst)
    assert fs.read_bytes(f"{lay.final_dir('c')}/best.pt") == b"again"


def test_the_lock_is_exclusive_waits_and_is_renewed(s3: S3, tmp_path: Path) -> None:
    a = _fs(s3, tmp_path, lease=1.0)  # renewed every 1/3 s; unrenewed, past after 1 s + SLACK
    b = _fs(s3, tmp_path, a.root, lease=1.0)
    lay = SweepLayout(a.root)
    rec = (lay.lock_holder, b'{"by": "me@here", "op": "launch"}')
    held = a.lock(lay.lock_file, 0.0, rec)
    taken = time.monotonic()  # after the lease was written
    assert held is not None
    assert b.read_bytes(lay.lock_holder) == rec[1]
    body = json.loads(b.read_bytes(lay.lock_file) or b"")
    assert set(body) >= {"by", "pid", "host", "t", "lease"} and body["lease"] == 1.0
    t0 = time.monotonic()
    assert b.lock(lay.lock_file, 1.0) is None
    assert 0.9 <= time.monotonic() - t0 < 10
    # Longer than an unrenewed lease lasts, by the store's clock (lease + SLACK, and a second more:
    # its LastModified has whole seconds) since it was taken: its renewals keep it.
    time.sleep(max(0.0, taken + 3.2 - time.monotonic()))
    assert b.lock(lay.lock_file, 0.0) is None
    assert json.loads(b.read_bytes(lay.lock_file) or b"")["renewed"] >= 1
    held.release()
    assert b.read_bytes(lay.lock_holder) is None and not b.exists(lay.lock_file)
    again = b.lock(lay.lock_file, 0.0)
    assert again is not None
    again.release()


def test_an_expired_lease_is_taken_over_by_exactly_one_and_release_deletes_only_its_own(
        s3: S3, tmp_path: Path) -> None:
    dead = _fs(s3, tmp_path, lease=0.5)
    lay = SweepLayout(dead.root)
    held = dead.lock(lay.lock_file, 0.0)
    assert held is not None
    held.lease._stop.set()  # its holder died: nobody renews it
    held.lease._thread.join()
    takers = [_fs(s3, tmp_path, dead.root, lease=30.0) for _ in range(2)]
    # past the lease + SLACK by the store's clock, whose LastModified (the lease's and the clock's
    # own) has whole seconds: 0.5 + 1 + 1 s at least
    time.sleep(2.7)
    got: list[Any] = [None, None]

    def take(i: int) -> None:
        got[i] = takers[i].lock(lay.lock_file, 0.0)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [g for g in got if g is not None]
    assert len(winners) == 1
    mine = json.loads(dead.read_bytes(lay.lock_file) or b"")
    assert mine["id"] == winners[0].lease.body["id"]
    held.release()  # the dead holder's late release: not its lock any more
    assert json.loads(dead.read_bytes(lay.lock_file) or b"")["id"] == mine["id"]
    winners[0].release()
    assert not dead.exists(lay.lock_file)


def _state(fs: StoreFS, now: float) -> None:
    """A store as runners leave it: a queue on h1 ran a (published), crashed on c, runs b."""
    lines = ["# ablate: host=h1", "cfgs/x/a.yaml recon", "cfgs/x/b.yaml recon", "cfgs/x/c.yaml recon",
             "cfgs/x/d.yaml recon"]
    st = fs.store
    st.put("queues/q1.txt", "".join(ln + "\n" for ln in lines).encode())
    entry = {"t": now, "host": "h1", "slot": None, "start_index": 0, "lines": len(lines),
             "prefix_sha256": prefix_sha256(lines), "spec": None, "run_queue": None, "op": "launch"}
    st.put("queues/q1.ledger", (json.dumps(entry) + "\n").encode())
    for i, name in ((1, "a"), (3, "c"), (2, "b")):
        st.put(f"claims/{name}/owner", f"h1 q1 {i} {now}\n".encode())
    evs = [{"ev": "queue_start", "start_index": 0, "slot": None},
           {"ev": "start", "idx": 1, "cell": "a", "resume": 0}, {"ev": "end", "idx": 1, "cell": "a", "rc": 0},
           {"ev": "start", "idx": 3, "cell": "c", "resume": 0}, {"ev": "end", "idx": 3, "cell": "c", "rc": 1},
           {"ev": "start", "idx": 2, "cell": "b", "resume": 0}]
    for ev in evs:
        line = json.dumps({"t": now, "host": "h1", "queue": "q1", **ev}) + "\n"
        st.append("events/h1.q1.jsonl", line.encode())
    st.put("tails/c.log", b"Traceback (most recent call last):\nValueError: boom\n")
    hb = {"t": now, "host": "h1", "queue": "q1", "slot": None, "pid": 1, "pgid": 1, "state": "running",
          "idx": 2, "cell": "b", "cell_started": now, "from_queue": None, "log_mtime": None,
          "log_size": None, "run_queue": None, "spec": None, "next": 4, "deferred": [], "services": None}
    st.put("heartbeats/h1.q1", json.dumps(hb).encode())


def test_probe_snapshot_reads_the_store_by_its_clock(s3: S3, tmp_path: Path) -> None:
    fs = _fs(s3, tmp_path)
    _state(fs, time.time())
    _commit(fs.store, "a", {"metrics.json": b'{"val_loss": 0.5}'},
            {"name": "a", "cfg": "cfgs/x/a.yaml", "task": "recon", "epochs": 3, "host": "h1", "queue": "q1",
             "artifacts": {"metrics": {"file": "metrics.json"}}})
    raw = fs.probe("snapshot", {"root": fs.root})
    snap = Snapshot.parse(raw)
    assert abs(snap.now - time.time()) < 5
    assert {n: (c.host, c.queue) for n, c in snap.claims.items()} == {n: ("h1", "q1") for n in "abc"}
    assert set(snap.results) == {"a"} and snap.results["a"].valid and not snap.partial
    assert [e.ev for e in snap.events["h1.q1"]][-1] == "start" and "c" in snap.tails
    assert snap.ledgers["q1"][0].host == "h1" and "q1" in snap.queue_copies
    hb = snap.heartbeat("h1", "q1")
    assert hb is not None and hb.cell == "b" and -2 < snap.age(hb) < 5
    assert raw["fs_lag"]["store"] == fs.root
    time.sleep(2.2)  # no new beat: its age grows by the store's LastModified, not by our reads
    snap = Snapshot.parse(fs.probe("snapshot", {"root": fs.root, "touch": False}))
    hb = snap.heartbeat("h1", "q1")
    assert hb is not None and snap.age(hb) >= 1.2

    lay = SweepLayout(fs.root)
    fs.rename_noreplace(lay.claim("c"), lay.released_claim("c", "1700000100.000"))
    fs.rename_noreplace(lay.final_dir("a"), lay.aside_dir("a", "1700000100.000"))
    raw = fs.probe("snapshot", {"root": fs.root})
    snap = Snapshot.parse(raw)
    assert set(snap.claims) == {"a", "b"} and snap.released == {"c": ("c.1700000100.000",)}
    assert snap.results == {} and raw["aside"] == [".aside.a.1700000100.000"]
    assert fs.probe("queues", {"root": fs.root})["queues"].keys() == {"q1"}
    assert abs(fs.probe("now", {"root": fs.root})["now"] - time.time()) < 5


def test_probe_verify_and_report_read_the_result_files(s3: S3, tmp_path: Path) -> None:
    fs = _fs(s3, tmp_path)
    lay = SweepLayout(fs.root)
    files = {"best.json": b'{"w": [1, 2]}', "metrics.json": b'{"val_loss": 0.25}', "a.log": b"epoch 1\n"}
    arts = {role: {"file": f, "size": len(files[f]), "sha256": hashlib.sha256(files[f]).hexdigest()}
            for role, f in (("checkpoint", "best.json"), ("metrics", "metrics.json"), ("log", "a.log"))}
    _commit(fs.store, "a", files, {"name": "a", "cfg": "cfgs/x/a.yaml", "task": "recon", "epochs": 3,
                                   "artifacts": arts})
    artifacts = {"checkpoint": ["best.json"], "pick": "all", "metrics": "metrics.json",
                 "metrics_keys": ["val_loss"]}
    tree = fs.probe("verify", {"dir": lay.final, "artifacts": artifacts, "names": [], "load": False,
                               "hash": False})
    assert tree["dir"] == lay.final and tree["dirs"] == ["a"]
    assert tree["cells"]["a"]["manifest"]["name"] == "a" and tree["cells"]["a"]["problems"] is None
    assert not (Path(fs.copy) / "final_ckpts" / "a" / "best.json").exists()  # a listing fetches no checkpoint

    _commit(fs.store, "m", {"best.json": files["best.json"]}, {"name": "m", "artifacts": arts})  # no metrics
    report = fs.probe("report", {"root": fs.root, "metrics": "metrics.json"})
    assert report["metrics"]["a"] == {"values": {"val_loss": 0.25}, "error": None}
    assert report["metrics"]["m"] == {"values": None, "error": "no metrics file"}
    assert not (Path(fs.copy) / "final_ckpts" / "a" / "best.json").exists()

    bad = dict(files, **{"best.json": b'{"w": [9]}'})  # not the bytes its MANIFEST records
    _commit(fs.store, "z", bad, {"name": "z", "cfg": "cfgs/x/z.yaml", "task": "recon", "epochs": 3,
                                 "artifacts": arts})
    tree = fs.probe("verify", {"dir": lay.final, "artifacts": artifacts, "names": ["a", "z"]})
    assert tree["cells"]["a"]["problems"] == [], tree["cells"]["a"]
    assert tree["cells"]["a"]["checks"] and tree["cells"]["z"]["problems"]
    assert (Path(fs.copy) / "final_ckpts" / "a" / "best.json").read_bytes() == files["best.json"]

    answer = fs.probe("apply", {"root": fs.root, "ops": [
        {"op": "write_atomic", "path": lay.deployed, "data": "e30=", "mode": 420},
        {"op": "read", "path": lay.deployed}, {"op": "write_atomic", "path": lay.manifest("a"), "data": ""}]})
    assert answer["results"] == [None, "e30="] and answer["failed"]["index"] == 2
    assert fs.store.get("DEPLOYED.json") is not None  # to the store, not to the copy


def test_store_errors_are_fserrors_naming_the_url_never_a_secret(
        s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    quick_backoff(monkeypatch)  # botocore's tries at the store that does not answer, shorter apart
    url = "s3://no-such-bucket-ablate/p/ablate/sw"
    fs = StoreFS(url, s3.endpoint, store=Store(url, s3.endpoint, wait=1), copy=str(tmp_path / "c"))
    path = SweepLayout(url).deployed
    for call in (lambda: fs.write_atomic(path, b"{}"), lambda: fs.read_bytes(path),
                 lambda: fs.probe("snapshot", {"root": url})):
        with pytest.raises(FSError) as ei:
            call()
        msg = str(ei.value)
        assert msg.startswith("store: ") and "no-such-bucket-ablate" in msg and "NoSuchBucket" in msg, msg
        assert CREDS["AWS_SECRET_ACCESS_KEY"] not in msg and CREDS["AWS_ACCESS_KEY_ID"] not in msg
    with pytest.raises(OSError):
        fs.fetch(path, str(tmp_path / "x"))

    down = "s3://sweep-bucket/x/ablate/sw"
    fs = StoreFS(down, "http://127.0.0.1:9", store=Store(down, "http://127.0.0.1:9", wait=1, attempts=1),
                 copy=str(tmp_path / "d"))
    with pytest.raises(FSError, match=r"store: reading s3://sweep-bucket/x/ablate/sw/DEPLOYED.json failed: "
                                      r".*did not answer"):
        fs.read_bytes(SweepLayout(down).deployed)
    with pytest.raises(OSError, match=r"store: fetching .* did not answer"):
        fs.fetch(SweepLayout(down).deployed, str(tmp_path / "x"))


def _store_project(p: LocalProject, s3: S3) -> str:
    """A project whose profile keeps the sweep in a store; its one host, h1, never answers."""
    prefix = f"t/{uuid.uuid4().hex[:8]}"
    (p.root / "profiles").mkdir(exist_ok=True)
    (p.root / "profiles" / "s3.yaml").write_text(
        f"storage: {s3.url(prefix)}\nstorage_endpoint: {s3.endpoint}\nckpt_root: /root/ckpt\n")
    p.write_config(profile="s3", workdir="/srv/proj", hosts={"h1": {"ssh": "h1.invalid"}},
                   artifacts={"checkpoint": "best.json", "metrics": "metrics.json",
                              "metrics_keys": ["val_loss"]})
    for n in "abcd":
        p.cfg(f"cfgs/x/{n}.yaml")
    p.queue("q1", ["# ablate: host=h1", "cfgs/x/a.yaml recon", "cfgs/x/b.yaml recon", "cfgs/x/c.yaml recon",
                   "cfgs/x/d.yaml recon"])
    return f"{s3.url(prefix)}/ablate/t1"


def test_the_whole_model_reads_a_store_that_a_project_names(
        local_project: LocalProject, s3: S3, tmp_path: Path) -> None:
    url = _store_project(local_project, s3)
    project = load_project(local_project.root)
    fs = shared_fs(project)
    assert isinstance(fs, StoreFS) and fs.root == url and shared_fs(project) is fs
    now = time.time()
    _state(fs, now)
    cfg_sha = hashlib.sha256((local_project.root / "cfgs/x/a.yaml").read_bytes()).hexdigest()
    _commit(fs.store, "a", {}, {"name": "a", "cfg": "cfgs/x/a.yaml", "task": "recon", "epochs": 3,
                                "cfg_sha256": cfg_sha, "host": "h1", "queue": "q1"})
    # h1 answers with its queue's session and, as a store host does, an empty view
    asked = Asked({"h1": {session_name("t1", "h1", "q1")}}, {}, {"h1": {}})
    state = load(project, fs, ask=lambda: asked)
    assert state.lag.seconds == 0 and state.unsettled() == {} and state.allowance("h1") == 0
    got = classify_state(project, state)
    assert {n: c.state for n, c in got.cells.items()} == {"a": "synced", "b": "running", "c": "crashed",
                                                          "d": "queued"}
    assert state.queue("q1").state == "running"


@pytest.mark.tmux
def test_a_store_host_is_asked_its_tmux_and_answers_an_empty_view(
        local_project: LocalProject, s3: S3, tmux_socket: str) -> None:
    _store_project(local_project, s3)
    project = load_project(local_project.root)
    args = hostview.view_args(project, "h1")
    assert args == ["", "", "", "{}"]
    out = subprocess.run(["bash", "-c", hostview.SCRIPT, "bash", *args, "tmux", "-L", tmux_socket],
                         capture_output=True, text=True, check=True).stdout
    (sessions, why), view = hostview.parse(out)
    assert why is None and sessions == set()  # no server: no sessions
    assert view == ({}, None)


def test_the_commands_that_read_and_record_work_through_a_store(
        local_project: LocalProject, s3: S3, cli: Cli) -> None:
    _store_project(local_project, s3)
    fs = shared_fs(load_project(local_project.root))
    assert isinstance(fs, StoreFS)
    _state(fs, time.time())
    files = {"best.json": b'{"w": [1, 2]}', "metrics.json": b'{"val_loss": 0.25}', "a.log": b"epoch 1\n"}
    arts = {role: {"file": f, "size": len(files[f]), "sha256": hashlib.sha256(files[f]).hexdigest()}
            for role, f in (("checkpoint", "best.json"), ("metrics", "metrics.json"), ("log", "a.log"))}
    sha = hashlib.sha256((local_project.root / "cfgs/x/a.yaml").read_bytes()).hexdigest()
    manifest = {"name": "a", "cfg": "cfgs/x/a.yaml", "task": "recon", "epochs": 3, "cat": "x",
                "cfg_sha256": sha, "host": "h1", "queue": "q1", "artifacts": arts}
    _commit(fs.store, "a", files, manifest)

    status = cli.json(local_project, "status")
    want = {"a": "synced", "b": "running", "c": "crashed", "d": "queued"}
    assert {n: c["state"] for n, c in status["cells"].items()} == want
    assert status["fs_lag"]["seconds"] == 0 and "h1" in status["unreachable"]
    assert status["via"] == "the store"
    pulled = cli.json(local_project, "pull")
    assert pulled["copied"] == 4 and pulled["failed"] == [] and pulled["missing"] == ["b", "c", "d"]
    assert (local_project.root / "results/t1/a/best.json").read_bytes() == files["best.json"]
    assert cli.json(local_project, "reconcile", code=1)["verified"] == 1
    rec = cli.json(local_project, "reconcile", "--fs", code=1)
    assert rec["verified"] == 1 and rec["checked"]["a"]["best.json"] == "loaded"
    record = json.loads(fs.read_bytes(SweepLayout(fs.root).reconcile_record) or b"")
    assert record["source"] == "fs" and record["results_dir"] == f"{fs.root}/final_ckpts"
    report = cli.json(local_project, "report", "--out", str(local_project.root / "rep"))
    assert report["states"] == {"verified": 1, "running": 1, "crashed": 1, "queued": 1}
    r = cli(local_project, "release", "h1", "--yes")
    assert r.code == 1 and "not complete" in r.output
    r = cli(local_project, "logs", "a")  # the durable copy's log, read from the store here
    assert r.code == 0 and "epoch 1" in r.out, r.output


def test_under_the_watch_the_store_is_listed_at_most_every_poll(s3: S3, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`status --watch` refreshing every 2 s would list the store 9 times a refresh: within
    `polite_polling` a snapshot is read again from the copy until POLL seconds have passed."""
    from ablate.transport import storefs
    from tests.helpers.s3 import FaultProxy

    proxy = FaultProxy(s3.endpoint)
    try:
        url = s3.url(f"t/{uuid.uuid4().hex[:8]}/ablate/sw")
        fs = StoreFS(url, proxy.endpoint, store=Store(url, proxy.endpoint, wait=2),
                     copy=str(tmp_path / "copy"))
        fs.store.put("claims/a/owner", b"h1 q1 0 1 - n\n")

        def lists() -> int:
            before = proxy.counts.get("LIST", 0)
            fs.probe("snapshot", {"root": fs.root, "touch": False})
            return proxy.counts.get("LIST", 0) - before

        assert lists() > 0 and lists() > 0  # outside the watch: every read asks the store
        with storefs.polite_polling():
            assert lists() == 0  # within POLL of the last read: the copy, as it was read
            monkeypatch.setattr(storefs, "POLL", 0.0)
            assert lists() > 0
    finally:
        proxy.close()
