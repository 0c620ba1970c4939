"""The autostop watcher on a storage host (ablate/remote/host/autostop_store.py): the instance's own
copy of a sweep kept in an object store (a real S3 endpoint: moto's server), with nothing shared.
The watcher sees the sweep as the store has it, verifies its own results from the store's bytes,
stops when idle, decides the election in the store, and sends its records there, where the
controller's `status` view and `ablate autostop` read and write them; a queue's start brings the
launch's settings into the copy and starts a watcher that reaches the store with the environment
its runner process has."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.remote.host import autostop_store, autostop_watch
from ablate.remote.host.autostop_watch import Watcher
from ablate.remote.queue import serve
from ablate.remote.store.client import Store
from ablate.remote.store.queue_side import Agent
from ablate.run.autostop_control import autostop as autostop_control
from ablate.sweep import autostop_view
from ablate.sweep.autostop_view import HostAutostop
from ablate.transport.storefs import StoreFS
from tests.helpers import proc
from tests.helpers.project import LocalProject
from tests.helpers.results import make_result
from tests.helpers.s3 import CREDS, S3, FaultProxy, quick_backoff
from tests.helpers.wait import wait_for


@pytest.fixture(autouse=True)
def _short_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_FS_WAIT", "5")  # a store that does not answer fails the test, soon
    # the instance runs this sweep alone: its watchers read an empty /proc of their own, not this
    # machine's, where other tests' queues run (autostop.other_sweeps)
    (tmp_path / "proc").mkdir()
    monkeypatch.setenv("ABLATE_AUTOSTOP_PROC", str(tmp_path / "proc"))


def settings(idle: float, command: str) -> bytes:
    return json.dumps({"idle": idle, "command": command, "keep": 1, "steal": False, "heartbeat": 1,
                       "tasks": "recon=1",
                       "artifacts": {"checkpoint": ["model.safetensors"], "pick": "all",
                                     "metrics": "metrics.json", "metrics_keys": []}}).encode()


def publish(st: Store, name: str, host: str, tmp: Path, flip: bool = False) -> str:
    """A result committed as run_one's commit does (its files, MANIFEST.json, then the commit); with
    `flip`, one byte of the store's copy of its checkpoint flipped (same size: only the sha256 says)."""
    d = make_result(tmp / f"staging-{uuid.uuid4().hex[:6]}", f"cfgs/{name}.yaml", "recon", 1, host=host)
    nonce = f"{host}.{uuid.uuid4().hex[:12]}"
    for p in sorted(d.rglob("*")):
        if p.is_file() and p.name != "MANIFEST.json":
            data = p.read_bytes()
            if flip and p.name == "model.safetensors":
                data = data[:-1] + bytes([data[-1] ^ 1])
            st.put(f"results/{name}/{nonce}/{p.relative_to(d)}", data)
    st.put(f"results/{name}/{nonce}/MANIFEST.json", (d / "MANIFEST.json").read_bytes())
    rec = {"nonce": nonce, "host": host, "queue": "q1", "t": time.time()}
    assert st.create(f"commits/{name}", json.dumps(rec).encode()) is not None
    return nonce


def queue(st: Store, q: str, host: str, cells: list[str]) -> None:
    st.put(f"queues/{q}.txt", "".join(f"cfgs/{c}.yaml recon\n" for c in cells).encode())
    st.put(f"queues/{q}.ledger", (json.dumps({"op": "launch", "host": host, "start_index": 0,
                                              "t": time.time() - 60}) + "\n").encode())
    st.put(f"heartbeats/{host}.{q}", json.dumps({"state": "drained", "pid": 0}).encode() + b"\n")
    st.put(f"events/{host}.{q}.jsonl", b"{}\n")
    for i, c in enumerate(cells):
        st.put(f"claims/{c}/owner", f"{host} {q} {i} 1.0 - -\n".encode())


def sweep(s3: S3, tmp: Path, *, idle: float = 1200, command: str = "stop-me", flip: bool = False,
          url: str | None = None) -> Store:
    """One host h1 with one queue q1 of one cell, c1, done and committed to the store; autostop on."""
    st = Store(url or s3.url(f"as/{uuid.uuid4().hex[:8]}/ablate/t1"), s3.endpoint, wait=5)
    queue(st, "q1", "h1", ["c1"])
    publish(st, "c1", "h1", tmp, flip=flip)
    st.put("autostop/h1.settings.json", settings(idle, command))
    return st


class Clock:
    """This machine's clock, moved on by `ahead` seconds (the copy's mtimes are in this clock)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self, root: str, host: str) -> float:
        return time.time() + self.ahead


def watcher(st: Store, s3: S3, root: Path, host: str, ran: list[str],
            monkeypatch: pytest.MonkeyPatch, endpoint: str | None = None) -> Watcher:
    """The watcher as `main` makes it on a storage host: its store side from the runner's environment."""
    monkeypatch.setenv("ABLATE_STORE", st.url)
    monkeypatch.setenv("ABLATE_STORE_ENDPOINT", endpoint or s3.endpoint)
    store = autostop_store.from_env(str(root), host)
    assert store is not None

    def run(command: str) -> tuple[int, str]:  # the instance "stops": the command recorded, once the
        told = json.loads(in_store(st, f"autostop/{host}.state.json"))  # store has heard it stops
        assert told["kind"] == "stopping", told
        ran.append(command)
        return 0, "bye"

    w = Watcher(str(root), host, clock=Clock(), run=run, store=store)
    w.settle = 0.0
    return w


def state(root: Path, host: str = "h1") -> dict[str, object]:
    data: dict[str, object] = json.loads((root / "autostop" / f"{host}.state.json").read_text())
    return data


def in_store(st: Store, rel: str) -> bytes:
    got = st.get(rel)
    assert got is not None, rel
    return got.data


def controller(s3: S3, st: Store, tmp: Path) -> dict[str, HostAutostop]:
    """What `ablate status` shows of each host's autostop: the controller's snapshot of the store."""
    fs = StoreFS(st.url, s3.endpoint, store=Store(st.url, s3.endpoint, wait=5),
                 copy=str(tmp / f"controller-{uuid.uuid4().hex[:6]}"))
    return autostop_view.of_raw(fs.probe("snapshot", {"root": fs.root}))


def end_watchers(root: Path) -> None:
    """The detached watchers of this copy (it stopped nothing: it goes on checking) ended, by their
    process ids, and their lock free again."""
    for pid in proc.with_args("autostop", str(root)):
        os.kill(pid, signal.SIGTERM)

    def free() -> bool:
        fd = autostop_watch._try_lock(autostop_watch.lock_path(str(root), "h1"))
        if fd is not None:
            os.close(fd)
        return fd is not None

    wait_for(free, 30)


def test_no_store_in_the_environment_is_no_store_side(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABLATE_STORE", raising=False)
    assert autostop_store.from_env(str(tmp_path), "h1") is None


def test_it_sees_the_sweep_in_the_store_stops_once_idle_and_its_records_reach_the_store(
        s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = sweep(s3, tmp_path, idle=1200)
    root = tmp_path / "instance"  # its own copy: empty, nothing shared
    ran: list[str] = []
    w = watcher(st, s3, root, "h1", ran, monkeypatch)
    w.step()
    st1 = state(root)
    assert st1["kind"] == "idle" and st1["why"] == "stops in 20 min" and ran == [], st1
    # its own result's files came from the store, and were verified there (cached by manifest)
    assert (root / "final_ckpts" / "c1" / "model.safetensors").is_file() and len(w.cache) == 1
    assert in_store(st, "autostop/h1.state.json") == (root / "autostop" / "h1.state.json").read_bytes()
    seen = controller(s3, st, tmp_path)["h1"]
    assert seen.on and seen.kind == "idle" and seen.why().startswith("stops in ") and not seen.stopped

    w.clock.ahead = 1300  # type: ignore[attr-defined]
    w.step()
    assert ran == ["stop-me"]
    local = (root / "autostop" / "h1.jsonl").read_bytes()
    assert in_store(st, "autostop/h1.jsonl") == local  # every line, once, in order
    kinds = [e.get("kind") or e["ev"] for e in map(json.loads, local.splitlines())]
    assert kinds == ["idle", "stopping", "stopped", "stop_failed"], kinds
    assert in_store(st, "autostop/h1.state.json") == (root / "autostop" / "h1.state.json").read_bytes()


def test_a_flipped_byte_in_the_stores_copy_of_its_result_keeps_it_up(
        s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = sweep(s3, tmp_path, idle=0, flip=True)
    publish(st, "c2", "h2", tmp_path)  # another host's result: never fetched here
    root = tmp_path / "instance"
    ran: list[str] = []
    w = watcher(st, s3, root, "h1", ran, monkeypatch)
    w.step()
    got = state(root)
    assert got["kind"] == "unverified" and "c1" in str(got["why"]) and ran == [], got
    assert json.loads(in_store(st, "autostop/h1.state.json"))["kind"] == "unverified"
    assert controller(s3, st, tmp_path)["h1"].why().startswith("unverified result: c1")
    assert (root / "final_ckpts" / "c2" / "MANIFEST.json").is_file()
    assert w.store is not None and w.store.verify_files(["c2"]) == []  # asked by name: still not its own
    assert not (root / "final_ckpts" / "c2" / "model.safetensors").exists()
    w.step()
    assert state(root)["kind"] == "unverified" and ran == []  # checked again: still not good

    # remediate sets it aside and the cell is published again, intact: that one is fetched, and it goes
    commit = in_store(st, "commits/c1")
    st.put(f"aside/c1.{time.time():.3f}", commit)
    st.delete("commits/c1")
    publish(st, "c1", "h1", tmp_path)
    w.step()
    assert ran == ["stop-me"], state(root)


def test_a_store_it_cannot_reach_is_unsure_and_what_it_recorded_meanwhile_is_sent_after(
        s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = sweep(s3, tmp_path, idle=1200)
    proxy = FaultProxy(s3.endpoint)
    monkeypatch.setenv("ABLATE_FS_WAIT", "1")
    quick_backoff(monkeypatch)  # botocore's attempts at the refused store, each after a shorter wait
    try:
        root = tmp_path / "instance"
        ran: list[str] = []
        w = watcher(st, s3, root, "h1", ran, monkeypatch, endpoint=proxy.endpoint)
        w.step()
        assert state(root)["kind"] == "idle"
        proxy.down()
        w.clock.ahead = 5000  # type: ignore[attr-defined]  # idle long past: it would stop
        w.step()
        got = state(root)
        assert got["kind"] == "unsure" and "store" in str(got["why"]) and ran == [], got
        assert w.store is not None and w.store.error is not None
        assert json.loads(in_store(st, "autostop/h1.state.json"))["kind"] == "idle"  # not heard yet
        proxy.up()
        w.clock.ahead = 0  # type: ignore[attr-defined]
        w.step()
        assert w.store.error is None and state(root)["kind"] == "idle"
        local = (root / "autostop" / "h1.jsonl").read_bytes()
        assert in_store(st, "autostop/h1.jsonl") == local  # the outage's lines too, each once
        assert [json.loads(x)["kind"] for x in local.splitlines()] == ["idle", "unsure", "idle"]
    finally:
        proxy.close()


def test_no_stop_the_store_did_not_hear_of(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store goes away once the check has read it (check syncs, then reads the clock): the stop
    it decides cannot record `stopping` there, so it does not stop; the store back, it does."""
    st = sweep(s3, tmp_path, idle=1200)
    proxy = FaultProxy(s3.endpoint)
    monkeypatch.setenv("ABLATE_FS_WAIT", "1")
    quick_backoff(monkeypatch)  # botocore's attempts at the refused store, each after a shorter wait

    def store_gone(root: str, host: str) -> float:  # and its idle time long past
        proxy.down()
        return time.time() + 5000

    try:
        root = tmp_path / "instance"
        ran: list[str] = []
        w = watcher(st, s3, root, "h1", ran, monkeypatch, endpoint=proxy.endpoint)
        w.step()
        assert state(root)["kind"] == "idle"  # its result fetched and verified
        w.clock = store_gone
        puts = w.store.store.requests.get("put", 0)
        w.step()
        got = state(root)
        assert got["kind"] == "unsure" and str(got["why"]).startswith("not stopping") and ran == [], got
        # the store's outage was waited out once in that check (its first send after the sync), not
        # once more for each record after it
        assert w.store.store.requests.get("put", 0) == puts + 1
        proxy.up()
        w.clock = Clock()
        w.clock.ahead = 5000
        w.step()
        assert ran == ["stop-me"]
    finally:
        proxy.close()


def test_who_stays_for_remediation_is_decided_once_in_the_store(
        s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = sweep(s3, tmp_path, idle=0)
    queue(st, "q2", "h2", ["c3"])  # c3 crashed on h2: claimed, no result, its queue drained
    st.put("autostop/h2.settings.json", settings(0, "stop-me"))
    st.put("estimates.tsv", b"host\th2\t-\t2000\nhost\th1\t-\t1000\n")  # h2 is the faster
    ran: dict[str, list[str]] = {"h1": [], "h2": []}
    w2 = watcher(st, s3, tmp_path / "i2", "h2", ran["h2"], monkeypatch)
    w1 = watcher(st, s3, tmp_path / "i1", "h1", ran["h1"], monkeypatch)
    w2.step()
    assert state(tmp_path / "i2", "h2")["kind"] == "kept" and ran["h2"] == []
    decided = json.loads(in_store(st, "autostop/keepers.1.json"))
    assert decided["hosts"] == ["h2"] and decided["by"] == "h2"
    # h1 would elect itself now; the election was decided, in the store: it goes, h2 stays
    st.put("estimates.tsv", b"host\th1\t-\t3000\nhost\th2\t-\t1000\n")
    w1.step()
    assert ran["h1"] == ["stop-me"] and ran["h2"] == []
    assert json.loads((tmp_path / "i1" / "autostop" / "keepers.1.json").read_text())["hosts"] == ["h2"]


def test_ablate_autostop_cancel_reaches_the_watcher_through_the_store(
        local_project: LocalProject, s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"t/{uuid.uuid4().hex[:8]}"
    (local_project.root / "profiles").mkdir()
    (local_project.root / "profiles" / "s3.yaml").write_text(
        f"storage: {s3.url(prefix)}\nstorage_endpoint: {s3.endpoint}\nckpt_root: /root/ckpt\n")
    local_project.write_config(profile="s3", workdir="/srv/proj", hosts={"h1": {"ssh": "h1.invalid"}})
    project = load_project(local_project.root)
    st = sweep(s3, tmp_path, idle=0, url=f"{s3.url(prefix)}/ablate/t1")
    got = autostop_control(project, cancel=True)
    assert list(got.changed) == ["h1"]
    assert json.loads(in_store(st, "autostop/h1.control.json"))["cancelled"] is True
    ran: list[str] = []
    root = tmp_path / "instance"
    watcher(st, s3, root, "h1", ran, monkeypatch).step()
    assert state(root)["kind"] == "off" and state(root)["why"] == "autostop cancelled" and ran == []
    assert autostop_control(project).hosts["h1"].why().startswith("autostop cancelled")


def test_a_queues_start_brings_the_launchs_settings_and_its_watcher_reaches_the_store(
        s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve's start on a storage host: the launch wrote the settings into the store; the queue's
    runner process brings them into the copy and starts the detached watcher, which inherits the
    store and its credentials from that process, stops the instance and says so in the store. The
    stop command runs without the credentials; no file of the copy and no object holds them."""
    out = tmp_path / "stop.env"
    st = sweep(s3, tmp_path, idle=0, command=f"env > {out}; echo bye")
    root = tmp_path / "instance"
    monkeypatch.setenv("ABLATE_STORE", st.url)  # as run_queue exports them to its runner process
    monkeypatch.setenv("ABLATE_STORE_ENDPOINT", s3.endpoint)
    agent = Agent(str(root), "h1", "q1", st.url, s3.endpoint)
    hb = root / "heartbeats" / "h1.q1"  # the queue's own, written here (run_queue's: drained)
    hb.parent.mkdir(parents=True, exist_ok=True)
    hb.write_text(json.dumps({"state": "drained", "pid": 0}) + "\n")
    base = [str(root), "h1", "q1", "-"]
    try:
        serve.autostop(base, agent)
        copied = (root / "autostop" / "h1.settings.json").read_bytes()
        assert copied == in_store(st, "autostop/h1.settings.json")

        def stopped() -> bool:
            got = st.get("autostop/h1.state.json")
            return got is not None and json.loads(got.data)["kind"] == "stopped"

        wait_for(stopped, timeout=60, interval=0.2)
        seen = controller(s3, st, tmp_path)["h1"]
        assert seen.stopped and seen.line().startswith("host h1 stopped (autostop): stopped itself at")
        env = out.read_text()
        assert "ABLATE_HOST=h1" in env and "AWS_SECRET_ACCESS_KEY" not in env
        assert "AWS_ACCESS_KEY_ID" not in env
        secret = CREDS["AWS_SECRET_ACCESS_KEY"].encode()
        assert not [p for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]
        assert not [o.key for o in st.list("") if secret in in_store(st, o.key)]
    finally:
        end_watchers(root)

    # a launch without autostop removed them from the store: gone from the copy, no watcher started
    st.delete("autostop/h1.settings.json")
    serve.autostop(base, agent)
    assert not (root / "autostop" / "h1.settings.json").exists()
