"""Durable resume copies of a sweep kept in an object store (ablate/remote/resume/store_place.py),
against a real S3 endpoint (moto's server): committed by their RESUME.json, restored on another
instance's disk, an upload cut midway never restored, the cell's attempts counted in the store."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load, save_file

from ablate.config.project import load_project
from ablate.remote.resume import copies, keeper
from ablate.remote.resume.store_place import FETCH, StorePlace
from ablate.remote.store.client import Store
from ablate.run.deploy import deploy
from ablate.transport.storefs import open_store_fs
from tests.helpers.project import LocalProject
from tests.helpers.s3 import S3
from tests.helpers.store_instances import instance, start, store_events
from tests.helpers.wait import wait_for

FAULT_TRAIN = Path(__file__).parent / "helpers" / "fault_train.py"


def _save(ckpt: Path, step: int) -> None:
    """An HF-Trainer-like checkpoint dir, finished writing a while ago."""
    d = ckpt / f"checkpoint-{step}"
    d.mkdir(parents=True, exist_ok=True)
    save_file({"w": np.full(4, step, dtype=np.float32)}, str(d / "model.safetensors"))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    past = time.time_ns() - 5_000_000_000
    for f in d.iterdir():
        os.utime(f, ns=(past, past))
    os.utime(d, ns=(past + step, past + step))


def _place(s3: S3, root: Path, url: str | None = None) -> StorePlace:
    url = url or s3.url(f"resume/{uuid.uuid4().hex[:8]}/ablate/t1")
    return StorePlace(Store(url, s3.endpoint), str(root))


def _keys(st: Store, prefix: str = "resume/") -> list[str]:
    return [o.key for o in st.list(prefix)]


def test_copies_are_committed_by_their_record_and_two_are_kept(s3: S3, tmp_path: Path) -> None:
    place, ckpt = _place(s3, tmp_path / "h1" / "t1"), tmp_path / "h1" / "ckpt" / "c1"
    k = keeper.Keeper(place, "c1", str(ckpt), "checkpoint-*", "newest", {"host": "h1", "queue": "q1"},
                      period=0.01)
    _save(ckpt, 10)
    assert k.once(settle=True) is None  # seen once: not yet known to be complete
    first = k.once(settle=True)
    assert first is not None and first.seq == 1 and k.once(settle=True) is None
    for step in (20, 30):
        _save(ckpt, step)
        assert k.flush() is not None
    assert [c.seq for c in place.committed("c1")] == [3, 2]
    rec = place.record(place.committed("c1")[0])
    assert rec is not None and rec["step"] == 30 and len(rec["files"]) == 2
    assert _keys(place.store) == sorted(f"resume/c1/{s}/{f}" for s in (2, 3) for f in (
        "RESUME.json", f"checkpoint-{s}0/model.safetensors", f"checkpoint-{s}0/trainer_state.json"))


def test_another_instance_restores_the_newest_copy_with_mtimes_and_links(s3: S3, tmp_path: Path) -> None:
    place = _place(s3, tmp_path / "h1" / "t1")
    ckpt = tmp_path / "h1" / "ckpt" / "c1"
    (ckpt / "ckpts").mkdir(parents=True)
    target = ckpt / "ckpts" / "epoch=3-step=120.safetensors"
    save_file({"w": np.ones(3, dtype=np.float32)}, str(target))
    (ckpt / "ckpts" / "last.safetensors").symlink_to("epoch=3-step=120.safetensors")
    os.utime(target, ns=(1_700_000_000_000_000_000,) * 2)
    k = keeper.Keeper(place, "c1", str(ckpt), "ckpts/last.safetensors", "newest", {"host": "h1"})
    assert k.flush() is not None

    h2 = StorePlace(Store(place.store.url, s3.endpoint), str(tmp_path / "h2" / "t1"))  # its own disk
    other = tmp_path / "h2" / "ckpt" / "c1"
    lines, event = keeper.prep(h2, "c1", str(other), "1", "ckpts/last.safetensors", "newest", "h2 q1")
    assert lines[0].startswith("resume=1 attempt=1 ") and "step=120 " in lines[0], lines
    assert event is not None and event["from"] == "copy" and event["made_on"] == "h1"
    link = other / "ckpts" / "last.safetensors"
    assert link.is_symlink() and os.readlink(link) == "epoch=3-step=120.safetensors"
    assert link.read_bytes() == target.read_bytes()
    assert (other / "ckpts" / target.name).stat().st_mtime_ns == 1_700_000_000_000_000_000
    assert not os.listdir(tmp_path / "h2" / "t1" / FETCH)  # the download went into {ckpt_dir}
    # the attempts are the store's: a third start anywhere is the cell's third
    again, _ = keeper.prep(place, "c1", str(tmp_path / "h3" / "c1"), "0", "ckpts/last.safetensors",
                           "newest", "h3 q1")
    assert again[0].startswith("resume=1 attempt=2 ")
    assert keeper.prep(h2, "c1", str(other), "1", "ckpts/last.safetensors", "newest", "h2 q1")[0][0] \
        .startswith("resume=1 attempt=3 ")


def test_an_upload_cut_midway_or_damaged_is_never_restored(s3: S3, tmp_path: Path) -> None:
    place, ckpt = _place(s3, tmp_path / "h1" / "t1"), tmp_path / "h1" / "ckpt" / "c1"
    k = keeper.Keeper(place, "c1", str(ckpt), "checkpoint-*", "newest", {"host": "h1"})
    _save(ckpt, 10)
    k.flush()
    _save(ckpt, 20)
    k.flush()
    # copy 3: its files on their way when the instance died: no RESUME.json
    place.store.put("resume/c1/3/checkpoint-30/model.safetensors", b"half of it")
    # copy 2: its weights replaced by other bytes of the same size (only the sha256 finds it)
    key = "resume/c1/2/checkpoint-20/model.safetensors"
    got = place.store.get(key)
    assert got is not None
    place.store.put(key, got.data[:-1] + bytes([got.data[-1] ^ 0xFF]))

    other = tmp_path / "h2" / "ckpt" / "c1"
    lines, event = keeper.prep(place, "c1", str(other), "0", "checkpoint-*", "newest", "h2 q1")
    assert lines[0].startswith("resume=1 ") and "step=10 " in lines[0], lines
    assert event is not None and event["seq"] == 1 and "copy 2" in event["skipped"][0]
    assert "sha256" in event["skipped"][0] and any("damaged, not restored" in ln for ln in lines[1:])
    assert sorted(p.name for p in other.iterdir()) == ["checkpoint-10"]
    # the next commit prunes the dead upload (below the newest committed copy) and the oldest copy
    _save(ckpt, 40)
    assert k.flush() is not None
    assert sorted({key.split("/")[2] for key in _keys(place.store) if key.count("/") >= 3}) == ["2", "4"]


def test_a_commit_refused_leaves_nothing_and_the_drop_takes_all(s3: S3, tmp_path: Path) -> None:
    place, ckpt = _place(s3, tmp_path / "h1" / "t1"), tmp_path / "h1" / "ckpt" / "c1"
    _save(ckpt, 10)
    seen = keeper.current(str(ckpt), "checkpoint-*", "newest")
    try:
        place.commit("c1", str(ckpt), seen, {"host": "h1"}, still_ours=lambda: False)
    except copies.CopyFailed as e:
        assert "no longer this run's" in str(e)
    else:
        raise AssertionError("a commit by a run whose claim was taken")
    assert _keys(place.store) == []
    assert place.commit("c1", str(ckpt), seen, {"host": "h1"}).seq == 1
    place.count_attempt("c1", "h1 q1 1.0")
    assert not place.published("c1")
    place.drop("c1")
    assert _keys(place.store) == []


def test_the_served_verbs_use_the_store_the_run_spec_names(s3: S3, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner decides where the copies are (ABLATE_STORE), not run_one."""
    url = s3.url(f"resume/{uuid.uuid4().hex[:8]}/ablate/t1")
    monkeypatch.setenv("ABLATE_STORE", url)
    monkeypatch.setenv("ABLATE_STORE_ENDPOINT", s3.endpoint)
    root, ckpt = tmp_path / "h1" / "t1", tmp_path / "h1" / "ckpt" / "c1"
    ckpt.mkdir(parents=True)
    keepers = keeper.Keepers([str(root), "h1", "q1", "-"], still_ours=lambda _c: True)
    assert isinstance(keepers.place, StorePlace)
    out: list[str] = []
    spec = [str(ckpt), "checkpoint-*", "newest"]
    assert keepers.verb(["resume-prep", "c1", spec[0], "0", *spec[1:]], out.append) == 0
    _save(ckpt, 7)
    assert keepers.verb(["resume-end", "c1", "143", *spec], out.append) == 0
    st = Store(url, s3.endpoint)
    assert "resume/c1/1/RESUME.json" in _keys(st) and not (root / "resume").exists()
    assert keepers.verb(["resume-drop", "c1"], out.append) == 0 and _keys(st) == []


def test_status_reads_the_copies_records_from_the_store_never_their_bytes(s3: S3, tmp_path: Path) -> None:
    from ablate.remote.host.probe import _resume_copies
    from ablate.remote.store.local_copy import STATE, Mirror

    place, ckpt = _place(s3, tmp_path / "h1" / "t1"), tmp_path / "h1" / "ckpt" / "c1"
    _save(ckpt, 10)
    place.count_attempt("c1", "h1 q1 1.0")
    place.commit("c1", str(ckpt), keeper.current(str(ckpt), "checkpoint-*", "newest"), {"host": "h1"})
    laptop = tmp_path / "laptop"
    Mirror(place.store, str(laptop)).sync(STATE)
    got = sorted(str(p.relative_to(laptop)) for p in (laptop / "resume").rglob("*") if p.is_file())
    assert got == ["resume/c1/1/RESUME.json", "resume/c1/attempts"]
    seen = _resume_copies(str(laptop))["c1"]
    assert [(c["seq"], c["step"], c["made_on"]) for c in seen] == [(1, 10, "h1")]
    place.drop("c1")
    Mirror(place.store, str(laptop)).sync(STATE)
    assert _resume_copies(str(laptop)) == {}


@pytest.mark.tmux  # run_queue's tools (the unit tier stubs them out)
def test_a_cell_killed_with_its_instance_resumes_on_another_from_the_store(
        local_project: LocalProject, s3: S3, tmp_path: Path) -> None:
    """No shared directory: h1's queue copies each complete checkpoint to the store while the cell
    trains; h1 is SIGKILLed and its disk wiped; its claim released as remediate releases it; h2's
    queue restores the newest copy and the trainer goes on from that epoch."""
    lp = local_project
    lp.write_config(train=f"{sys.executable} {FAULT_TRAIN} --config {{cfg}} --epochs {{epochs}} "
                          "--out {ckpt_dir} --resume {resume} --name {name}")
    lp.queue("q1", [lp.cfg("cfgs/a/c1.yaml", step_time=1.5) + " recon 8"])
    deploy(load_project(lp.root))
    url = s3.url(f"kill/{uuid.uuid4().hex[:8]}/ablate/t1")
    st = Store(url, s3.endpoint)
    st.put("queues/q1.txt", (lp.root / "queues" / "q1.txt").read_bytes())

    def copied_epoch() -> int:
        """The epoch of the newest committed copy in the store (0: none yet)."""
        recs = [o.key for o in st.list("resume/") if o.key.endswith("/RESUME.json")]
        if not recs:
            return 0
        top = max(recs, key=lambda k: int(k.split("/")[2])).rsplit("/", 1)[0]
        got = st.get(f"{top}/model.safetensors")
        return int(load(got.data)["epoch"][0]) if got is not None else 0

    rq, spec = instance(lp, tmp_path / "h1" / "t1", "h1", url, s3.endpoint)
    p = start(rq, spec, "q1", tmp_path / "h1" / "t1")
    try:
        wait_for(lambda: copied_epoch() >= 2, timeout=120)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=60)
    seen = copied_epoch()
    shutil.rmtree(tmp_path / "h1")
    shutil.rmtree(lp.root / ".ablate" / "local" / "h1")  # its ckpt_root: the instance's own disk
    assert open_store_fs(url, s3.endpoint).rename_noreplace(f"{url}/claims/c1", f"{url}/released/c1.1.0")

    rq, spec = instance(lp, tmp_path / "h2" / "t1", "h2", url, s3.endpoint)
    p = start(rq, spec, "q1", tmp_path / "h2" / "t1")
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 0, out.decode(errors="replace")
    assert st.head("commits/c1") is not None
    trace = [json.loads(x) for x in (lp.root / ".ablate" / "local" / "h2" / "ckpt" / "c1" / "trace.jsonl")
             .read_text().splitlines()]
    assert trace[0]["ev"] == "start" and trace[0]["resume"] == 1 and trace[0]["start_epoch"] >= seen >= 2
    evs = store_events(st)["events/h2.q1.jsonl"]
    restore = [e for e in evs if e["ev"] == "restore"]
    assert len(restore) == 1 and restore[0]["from"] == "copy" and restore[0]["made_on"] == "h1", evs
    assert _keys(st) == []  # published: every copy, and the attempts, gone from the store


@pytest.mark.tmux  # run_queue's tools (the unit tier stubs them out)
def test_a_lightning_run_stopped_as_a_spot_pod_resumes_on_another_instance_from_the_store(
        local_project: LocalProject, s3: S3, tmp_path: Path) -> None:
    """A real Lightning run (`save_last="link"`, `fit(ckpt_path="last")`) on h1 gets SIGTERM, then
    SIGKILL 5 s later, as RunPod stops a spot pod; h1's disk goes with it. h2 shares no directory
    with it: its run restores the store's copy, the link made again, and Lightning goes on from
    the epoch after the one saved."""
    lightning_resume_train = Path(__file__).parent / "helpers" / "lightning_resume_train.py"  # (not imported)

    lp = local_project
    lp.write_config(train=f"{sys.executable} {lightning_resume_train} --config {{cfg}} "
                          "--out {ckpt_dir} --resume {resume} --epochs 5 --name {name}",
                    artifacts={"checkpoint": "ckpts/epoch=*.ckpt", "pick": "newest",
                               "metrics": "metrics.json", "metrics_keys": ["val_loss"]},
                    resume={"checkpoint": ["ckpts/*last*.ckpt"], "pick": "newest"})
    (lp.root / "faults").mkdir()
    (lp.root / "faults" / "c1.hold").write_text("2\n")  # held as epoch 2 starts, epoch 1's saved
    lp.queue("q1", [lp.cfg("cfgs/a/c1.yaml") + " recon"])
    deploy(load_project(lp.root))
    url = s3.url(f"spot/{uuid.uuid4().hex[:8]}/ablate/t1")
    st = Store(url, s3.endpoint)
    st.put("queues/q1.txt", (lp.root / "queues" / "q1.txt").read_bytes())

    def durable() -> bool:
        for o in st.list("resume/c1/"):
            if o.key.endswith("/RESUME.json"):
                got = st.get(o.key)
                links = json.loads(got.data)["links"] if got is not None else []
                if links == [{"path": "ckpts/last.ckpt", "target": "ckpts/epoch=1-step=8.ckpt"}]:
                    return True
        return False

    rq, spec = instance(lp, tmp_path / "h1" / "t1", "h1", url, s3.endpoint)
    p = start(rq, spec, "q1", tmp_path / "h1" / "t1")
    try:
        wait_for(durable, timeout=120, interval=0.2)
        os.killpg(p.pid, signal.SIGTERM)
        time.sleep(5)  # the provider's grace, not a wait for a condition
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    finally:
        p.communicate(timeout=60)
    shutil.rmtree(tmp_path / "h1")
    shutil.rmtree(lp.root / ".ablate" / "local" / "h1")
    (lp.root / "faults" / "c1.hold").unlink()
    fs = open_store_fs(url, s3.endpoint)
    if st.get("claims/c1/owner") is not None:  # a TERMed queue keeps its cut cell's claim
        assert fs.rename_noreplace(f"{url}/claims/c1", f"{url}/released/c1.1.0")

    rq, spec = instance(lp, tmp_path / "h2" / "t1", "h2", url, s3.endpoint)
    p = start(rq, spec, "q1", tmp_path / "h2" / "t1")
    out, _ = p.communicate(timeout=240)
    assert p.returncode == 0, out.decode(errors="replace")
    ckpt = lp.root / ".ablate" / "local" / "h2" / "ckpt" / "c1"
    [run] = [json.loads(x) for x in (ckpt / "trace.jsonl").read_text().splitlines()]
    assert run["resumed"] is True and run["first_epoch"] == 2, run
    # Lightning went on. Its dirpath is another than h1's (each instance's ckpt_root here): it kept the
    # restored last.ckpt and wrote last-v1.ckpt, the newest `*last*.ckpt`, which `ckpt_path="last"` takes.
    newest = max((ckpt / "ckpts").glob("*last*.ckpt"), key=lambda f: f.stat().st_mtime)
    assert os.readlink(newest) == "epoch=4-step=20.ckpt", sorted(os.listdir(ckpt / "ckpts"))
    assert st.head("commits/c1") is not None and _keys(st) == []
