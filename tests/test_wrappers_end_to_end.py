"""The bash wrappers, driven the way users drive them: `launch` into real tmux, the real tiny
trainer, real files on a local "shared FS". Assertions read what the wrappers wrote: events,
heartbeats, claims, final_ckpts and MANIFEST.json."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.remote.layout import session_name
from ablate.run.launch import launch
from ablate.transport.local import LocalHost
from tests.helpers.project import TRAIN, LocalProject
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def events(lp: LocalProject, host: str, queue: str) -> list[dict[str, Any]]:
    path = lp.shared / "events" / f"{host}.{queue}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line valid JSON


def drained(lp: LocalProject, host: str, queue: str, since: int = 0) -> list[dict[str, Any]]:
    """Wait until the queue has written queue_end (after `since` events) and its tmux session is gone."""
    def done() -> list[dict[str, Any]] | None:
        evs = events(lp, host, queue)
        live = session_name("t1", host, queue) in LocalHost(host).tmux_sessions()
        return evs if not live and any(e["ev"] == "queue_end" for e in evs[since:]) else None

    result = wait_for(done, timeout=30)
    assert isinstance(result, list)
    return result


def finals(lp: LocalProject) -> set[str]:
    root = lp.shared / "final_ckpts"
    return {p.name for p in root.iterdir() if (p / "MANIFEST.json").exists()} if root.exists() else set()


def deployed_run_one(lp: LocalProject, host: str) -> tuple[Path, Path]:
    """The deployed run_one wrapper and `host`'s run spec, to call run_one by hand."""
    deployed = json.loads((lp.shared / "DEPLOYED.json").read_text())
    return lp.shared / "wrappers" / deployed["run_one"], lp.shared / "specs" / deployed["specs"][host]


def started(evs: list[dict[str, Any]]) -> list[str]:
    return [e["cell"] for e in evs if e["ev"] == "start"]


def test_start_index_runs_exactly_the_cells_from_k(local_project: LocalProject) -> None:
    lp = local_project
    names = [f"k{i}" for i in range(4)]
    lp.queue("q1", ["# ablate: host=h1", *(lp.cfg(f"cfgs/a/{n}.yaml") + " recon 1" for n in names)])
    launch(load_project(lp.root), "q1", "h1", start_index=3)  # line 3 is k2
    evs = drained(lp, "h1", "q1")
    assert started(evs) == ["k2", "k3"]
    assert [e["rc"] for e in evs if e["ev"] == "end"] == [0, 0]
    assert finals(lp) == {"k2", "k3"}
    assert evs[0]["ev"] == "queue_start" and evs[0]["start_index"] == 3
    assert evs[-1] == {**evs[-1], "ev": "queue_end", "idx": 5}
    hb = json.loads((lp.shared / "heartbeats" / "h1.q1").read_text())
    assert hb["state"] == "drained" and hb["cell"] == "k3" and hb["pgid"] == evs[0]["pgid"]
    assert not (lp.shared / "claims" / "k0").exists()
    owner = (lp.shared / "claims" / "k2" / "owner").read_text().split()
    assert owner[:3] == ["h1", "q1", "3"] and float(owner[3]) > 0


def test_same_line_in_two_queues_runs_once(local_project: LocalProject) -> None:
    lp = local_project
    shared = lp.cfg("cfgs/a/both.yaml") + " recon 2"
    lp.queue("q1", [shared, lp.cfg("cfgs/a/only1.yaml") + " recon 1"])
    lp.queue("q2", [shared, lp.cfg("cfgs/a/only2.yaml") + " recon 1"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    launch(project, "q2", "h2")
    ev1, ev2 = drained(lp, "h1", "q1"), drained(lp, "h2", "q2")
    assert (started(ev1) + started(ev2)).count("both") == 1
    loser = ev2 if "both" in started(ev1) else ev1
    assert [(e["cell"], e["reason"]) for e in loser if e["ev"] == "skip"] in (
        [("both", "claimed")], [("both", "done")])
    assert finals(lp) == {"both", "only1", "only2"}


def test_a_claim_left_without_an_owner_is_taken_over_by_one_queue(
        local_project: LocalProject, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claimer that ended between its mkdir and its owner (a queue stopped or cancelled as it took
    its first cell: CI saw it on Slurm) leaves claims/<cell>/ with no owner. Once the wait for the
    FS's lag is over, the queues that reach the cell take it over, and exactly one runs it (a hard
    link puts the owner in place); before, each skipped it as claimed and nobody ever ran it."""
    monkeypatch.setenv("ABLATE_CLAIM_WAIT", "2")  # the tmux server, started here, passes it on
    lp = local_project
    orphan = lp.cfg("cfgs/a/orphan.yaml") + " recon 1"
    lp.queue("q1", [orphan, lp.cfg("cfgs/a/only1.yaml") + " recon 1"])
    lp.queue("q2", [orphan, lp.cfg("cfgs/a/only2.yaml") + " recon 1"])
    claim = lp.shared / "claims" / "orphan"
    claim.mkdir(parents=True)
    (claim / ".owner.h9.4242").write_text("h9 q9 1 1700000000.0 - node9\n")  # its temp, never placed
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    launch(project, "q2", "h2")
    ev1, ev2 = drained(lp, "h1", "q1"), drained(lp, "h2", "q2")
    assert (started(ev1) + started(ev2)).count("orphan") == 1, (ev1, ev2)
    winner, loser = ("q1", ev2) if "orphan" in started(ev1) else ("q2", ev1)
    assert [(e["cell"], e["reason"]) for e in loser if e["ev"] == "skip"] in (
        [("orphan", "claimed")], [("orphan", "done")])
    assert finals(lp) == {"orphan", "only1", "only2"}
    assert (claim / "owner").read_text().split()[1] == winner
    assert sorted(p.name for p in claim.iterdir()) == [".owner.h9.4242", "owner"]  # no temp of ours left


def test_crlf_queue_runs_and_no_carriage_return_reaches_the_command(local_project: LocalProject) -> None:
    lp = local_project
    cfg = lp.cfg("cfgs/win/crlf.yaml")
    path = lp.root / "queues" / "q1.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(f"# from windows\r\n{cfg} det\r\n".encode())
    launch(load_project(lp.root), "q1", "h1")
    evs = drained(lp, "h1", "q1")
    assert [e["rc"] for e in evs if e["ev"] == "end"] == [0]
    assert b"\r" not in (lp.shared / "queues" / "q1.txt").read_bytes()
    log = (lp.root / ".ablate/local/h1/ckpt/crlf.log").read_bytes()
    assert b"\r" not in log
    assert b"--epochs 2 --out" in log  # the task default, not "2\r"
    manifest = json.loads((lp.shared / "final_ckpts/crlf/MANIFEST.json").read_text())
    assert (manifest["epochs"], manifest["cat"], manifest["task"]) == (2, "win", "det")
    # run_queue itself strips CR too, should a CRLF copy reach the FS some other way
    cfg2 = lp.cfg("cfgs/win/crlf2.yaml")
    fs_copy = lp.shared / "queues" / "q1.txt"
    fs_copy.write_bytes(f"# from windows\r\n{cfg} det\r\n{cfg2} det\r\n".encode())
    deployed = json.loads((lp.shared / "DEPLOYED.json").read_text())
    p = subprocess.run(["bash", str(lp.shared / "wrappers" / deployed["run_queue"]),
                        str(lp.shared / "specs" / deployed["specs"]["h1"]), "q1", "2"],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    log2 = (lp.root / ".ablate/local/h1/ckpt/crlf2.log").read_bytes()
    assert b"\r" not in log2 and b"--config cfgs/win/crlf2.yaml --epochs 2 --out" in log2
    assert json.loads((lp.shared / "final_ckpts/crlf2/MANIFEST.json").read_text())["epochs"] == 2


def test_failing_train_command_ends_nonzero_without_a_final_dir(local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/bad.yaml", exit_code=7) + " recon",
                    lp.cfg("cfgs/a/good.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    evs = drained(lp, "h1", "q1")
    ends = {e["cell"]: e["rc"] for e in evs if e["ev"] == "end"}
    assert ends == {"bad": 7, "good": 0}  # a failed cell does not stop the queue
    assert not (lp.shared / "final_ckpts" / "bad").exists()
    assert not [e for e in evs if e["ev"] in ("synced", "sync_failed") and e["cell"] == "bad"]
    assert "simulated failure exit 7" in (lp.root / ".ablate/local/h1/ckpt/bad.log").read_text()


def test_missing_artifact_after_rc0_is_sync_failed_exit_3(local_project: LocalProject) -> None:
    lp = local_project
    lp.write_config(artifacts={"checkpoint": "best.pth", "metrics": "metrics.json"})
    lp.queue("q1", [lp.cfg("cfgs/a/noart.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    evs = drained(lp, "h1", "q1")
    failed = [e for e in evs if e["ev"] == "sync_failed"]
    assert len(failed) == 1 and "best.pth" in failed[0]["reason"]
    assert [e["rc"] for e in evs if e["ev"] == "end"] == [3]
    assert not list((lp.shared / "final_ckpts").iterdir())  # no final dir, no staging left behind
    assert (lp.root / ".ablate/local/h1/ckpt/noart/model.safetensors").stat().st_size > 0
    assert "# ablate sync failed: checkpoint best.pth" in (lp.shared / "tails" / "noart.log").read_text()


def test_run_one_exit_code_3_keeps_the_local_checkpoint(local_project: LocalProject) -> None:
    """run_one on its own: a sync refused (the durable dir already exists) exits 3, local data intact."""
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/dup.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    drained(lp, "h1", "q1")
    run_one, spec = deployed_run_one(lp, "h1")
    before = (lp.shared / "final_ckpts/dup/MANIFEST.json").read_bytes()
    env = {**os.environ, "ABLATE_QUEUE": "manual"}
    p = subprocess.run(["bash", str(run_one), str(spec), "dup", "cfgs/a/dup.yaml", "recon", "1", "a", "0"],
                       capture_output=True, env=env, timeout=60)
    assert p.returncode == 3
    assert (lp.shared / "final_ckpts/dup/MANIFEST.json").read_bytes() == before
    assert (lp.root / ".ablate/local/h1/ckpt/dup/model.safetensors").exists()
    evs = events(lp, "h1", "manual")
    assert evs[-1]["ev"] == "sync_failed" and "already exists" in evs[-1]["reason"]


def test_manifest_fields_and_hashes(local_project: LocalProject) -> None:
    lp = local_project
    cfg = lp.cfg("cfgs/sub/m1.yaml", seed=3)
    lp.queue("q1", [f"{cfg} recon 2"])
    launch(load_project(lp.root), "q1", "h1")
    evs = drained(lp, "h1", "q1")
    final = lp.shared / "final_ckpts" / "m1"
    m = json.loads((final / "MANIFEST.json").read_text())
    deployed = json.loads((lp.shared / "DEPLOYED.json").read_text())
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    keys = ("name", "cfg", "task", "epochs", "cat", "host", "queue", "resume", "commit")
    assert {k: m[k] for k in keys} == {
        "name": "m1", "cfg": cfg, "task": "recon", "epochs": 2, "cat": "sub", "host": "h1", "queue": "q1",
        "resume": 0, "commit": None}
    assert m["cfg_sha256"] == sha(lp.root / cfg)
    assert f"run_one.{m['wrapper_version']}.sh" == deployed["run_one"]
    assert f"run_queue.{m['run_queue_version']}.sh" == deployed["run_queue"]
    assert f"{m['spec_version']}.env" == deployed["specs"]["h1"]
    assert m["started"] < m["ended"]
    assert set(m["artifacts"]) == {"checkpoint", "metrics", "log"}
    for art in m["artifacts"].values():
        f = final / art["file"]
        assert f.stat().st_size == art["size"] > 0 and sha(f) == art["sha256"]
    local = lp.root / ".ablate/local/h1/ckpt"
    assert sha(local / "m1/model.safetensors") == m["artifacts"]["checkpoint"]["sha256"]
    assert m["artifacts"]["log"]["file"] == "m1.log"
    assert [e["ev"] for e in evs] == ["queue_start", "start", "synced", "end", "queue_end"]
    assert not [p for p in (lp.shared / "final_ckpts").iterdir() if p.name.startswith(".staging")]


def test_slot_pins_cuda_visible_devices_and_gpu_field(local_project: LocalProject) -> None:
    lp = local_project
    lp.write_config(train=TRAIN + " && echo gpu={gpu} cvd=$CUDA_VISIBLE_DEVICES",
                    hosts={"h1": {"gpus": [0, 3]}})
    lp.queue("q1", ["# ablate: host=h1 slot=3", lp.cfg("cfgs/a/g.yaml") + " recon 1"])
    res = launch(load_project(lp.root), "q1", "h1")
    assert res.slot == 3
    evs = drained(lp, "h1", "q1")
    assert evs[0]["slot"] == 3
    assert "gpu=3 cvd=3" in (lp.root / ".ablate/local/h1/ckpt/g.log").read_text()


def test_invalid_line_in_the_fs_copy_is_skipped_never_run(local_project: LocalProject) -> None:
    """Defence in depth: launch validates, but a line with shell characters that reaches the FS copy
    anyway is skipped as invalid by run_queue and never executed."""
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/v1.yaml") + " recon 1"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    drained(lp, "h1", "q1")
    marker = lp.root / "pwned"
    fs_copy = lp.shared / "queues" / "q1.txt"
    fs_copy.write_text(fs_copy.read_text() + f"x;touch$IFS{marker} recon 1\nnope.yaml notatask\n")
    deployed = json.loads((lp.shared / "DEPLOYED.json").read_text())
    p = subprocess.run(["bash", str(lp.shared / "wrappers" / deployed["run_queue"]),
                        str(lp.shared / "specs" / deployed["specs"]["h1"]), "q1", "1"],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    evs = events(lp, "h1", "q1")
    assert [(e["idx"], e["reason"]) for e in evs if e["ev"] == "skip"] == [(1, "invalid"), (2, "invalid")]
    assert not marker.exists()


# The standard library's shutil with a bad copyfile, found first on PYTHONPATH by run_one's `publish`
# (python -S still reads PYTHONPATH): the copy a network FS "succeeded" at.
FAKE_SHUTIL = """import sys
here = sys.path.pop(sys.path.index(__file__.rpartition("/")[0]))
del sys.modules["shutil"]
import shutil
sys.path.insert(1, here)
def copyfile(src, dst, *, follow_symlinks=True):
    with open(src, "rb") as f:
        data = f.read()
    with open(dst, "wb") as f:
        f.write(BAD)
    return dst
shutil.copyfile = copyfile
sys.modules["shutil"] = shutil
"""


@pytest.mark.parametrize(("bad_copy", "reason"), [
    ("data[:10]", "is short"),  # a network FS "succeeding" short
    ("bytes((b + 1) % 256 for b in data)", "differs from its source"),  # same size
])
def test_a_bad_copy_is_caught_before_the_rename(local_project: LocalProject, tmp_path: Path,
                                                bad_copy: str, reason: str) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/cp.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    drained(lp, "h1", "q1")
    shutil.rmtree(lp.shared / "final_ckpts" / "cp")  # as if it had never synced
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "shutil.py").write_text(FAKE_SHUTIL.replace("BAD", bad_copy))
    deployed = json.loads((lp.shared / "DEPLOYED.json").read_text())
    env = {**os.environ, "PYTHONPATH": str(fake), "ABLATE_QUEUE": "manual"}
    p = subprocess.run(["bash", str(lp.shared / "wrappers" / deployed["run_one"]),
                        str(lp.shared / "specs" / deployed["specs"]["h1"]), "cp", "cfgs/a/cp.yaml", "recon",
                        "1", "a", "1"], capture_output=True, env=env, timeout=60)
    assert p.returncode == 3, p.stderr
    evs = events(lp, "h1", "manual")
    assert evs[-1]["ev"] == "sync_failed" and reason in evs[-1]["reason"]
    assert not list((lp.shared / "final_ckpts").iterdir())  # neither a final dir nor a staging dir
    assert (lp.root / ".ablate/local/h1/ckpt/cp/model.safetensors").stat().st_size > 10


def test_heartbeat_carries_the_log_stat_and_keeps_beating_while_the_log_is_silent(
        local_project: LocalProject) -> None:
    """What `hung` detection reads: the beat goes on while the trainer is quiet, the log's mtime does
    not move; between cells the log fields are null."""
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/quiet.yaml", step_time=4.0) + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    log = lp.root / ".ablate/local/h1/ckpt/quiet.log"
    hb_path = lp.shared / "heartbeats" / "h1.q1"

    def beat_after_print() -> dict[str, Any] | None:
        if not log.exists() or "epoch 1/1" not in log.read_text():
            return None
        hb = json.loads(hb_path.read_text())
        return hb if hb["log_size"] == log.stat().st_size else None

    first = wait_for(beat_after_print, timeout=30)
    assert isinstance(first, dict)
    assert first["state"] == "running" and first["cell"] == "quiet" and first["from_queue"] is None
    assert abs(first["log_mtime"] - log.stat().st_mtime) < 0.01
    later = wait_for(lambda: (hb := json.loads(hb_path.read_text()))["t"] > first["t"] + 0.5 and hb)
    assert isinstance(later, dict)
    assert (later["log_mtime"], later["log_size"]) == (first["log_mtime"], first["log_size"])
    assert later["cell_started"] == first["cell_started"]
    drained(lp, "h1", "q1")
    hb = json.loads(hb_path.read_text())
    assert (hb["state"], hb["cell"], hb["log_mtime"], hb["log_size"], hb["from_queue"]) == (
        "drained", "quiet", None, None, None)


def test_tail_of_the_log_is_written_for_a_failed_cell_only(local_project: LocalProject) -> None:
    lp = local_project
    lp.write_config(train=TRAIN + " && echo {name} done && test {name} != loud")
    lp.queue("q1", [lp.cfg("cfgs/a/loud.yaml") + " recon 150", lp.cfg("cfgs/a/fine.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    evs = drained(lp, "h1", "q1")
    assert {e["cell"]: e["rc"] for e in evs if e["ev"] == "end"} == {"loud": 1, "fine": 0}
    tails = lp.shared / "tails"
    assert sorted(p.name for p in tails.iterdir()) == ["loud.log"]  # no tmp file left, none for `fine`
    tail = (tails / "loud.log").read_text().splitlines()
    log = (lp.root / ".ablate/local/h1/ckpt/loud.log").read_text().splitlines()
    assert len(log) > 150 and tail == log[-100:]
    assert tail[-1].startswith("# ablate end ") and tail[-1].endswith("rc=1") and "loud done" in tail


def test_stop_file_lets_the_current_cell_finish_and_starts_no_other(local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/cur.yaml", step_time=0.5) + " recon 2",
                    lp.cfg("cfgs/a/next.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    wait_for(lambda: started(events(lp, "h1", "q1")) == ["cur"])
    (lp.shared / "control").mkdir(exist_ok=True)
    (lp.shared / "control" / "h1.q1.stop").write_text('{"t": 0, "by": "test"}\n')
    wait_for(lambda: session_name("t1", "h1", "q1") not in LocalHost("h1").tmux_sessions())
    evs = events(lp, "h1", "q1")
    assert [e["ev"] for e in evs] == ["queue_start", "start", "synced", "end", "queue_stop"]
    assert (evs[-2]["rc"], evs[-1]["idx"], evs[-1]["reason"]) == (0, 1, "after_current")
    assert finals(lp) == {"cur"} and not (lp.shared / "claims" / "next").exists()
    hb = json.loads((lp.shared / "heartbeats" / "h1.q1").read_text())
    assert (hb["state"], hb["cell"], hb["cell_started"]) == ("stopped", "cur", None)


def test_a_stale_slurm_attempt_does_not_publish_over_the_current_one(local_project: LocalProject) -> None:
    """Fencing: a claim names the attempt that owns the cell (`SLURM_JOB_ID.SLURM_RESTART_COUNT`);
    run_one of an older attempt (a job Slurm restarted while this one was cut off on its node)
    trains but never publishes; the owning attempt does."""
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/warm.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    drained(lp, "h1", "q1")
    run_one, spec = deployed_run_one(lp, "h1")
    cfg = lp.cfg("cfgs/a/fz.yaml").split()[0]
    claim = lp.shared / "claims" / "fz"
    claim.mkdir(parents=True)
    (claim / "owner").write_text("h1 q1 0 1700000000.0 41.1 node2\n")  # attempt 1 of job 41 owns it

    def attempt(a: str) -> int:
        env = {**os.environ, "ABLATE_QUEUE": "q1", "ABLATE_JOB_ATTEMPT": a}
        return subprocess.run(["bash", str(run_one), str(spec), "fz", cfg, "recon", "1", "a", "1"],
                              capture_output=True, env=env, timeout=60).returncode

    assert attempt("41.0") == 3
    assert not (lp.shared / "final_ckpts" / "fz").exists()
    assert not list((lp.shared / "final_ckpts").glob(".staging.*"))
    failed = [e for e in events(lp, "h1", "q1") if e["ev"] == "sync_failed" and e["cell"] == "fz"]
    assert len(failed) == 1 and "fenced" in failed[0]["reason"] and "41.1" in failed[0]["reason"], failed
    assert attempt("41.1") == 0
    manifest = json.loads((lp.shared / "final_ckpts" / "fz" / "MANIFEST.json").read_text())
    assert manifest["name"] == "fz" and manifest["resume"] == 1


def test_run_one_by_hand_publishes_through_a_python_start_and_names_a_missing_runner(
        local_project: LocalProject, tmp_path: Path) -> None:
    """run_one with no queue's runner process to ask (ABLATE_ASK unset) publishes through a Python
    start of its own (common.sh's ask_runner); a spec naming no runner fails the sync saying so."""
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/warm.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    drained(lp, "h1", "q1")
    run_one, spec = deployed_run_one(lp, "h1")
    bare = tmp_path / "bare.env"
    bare.write_text("".join(x for x in spec.read_text().splitlines(keepends=True)
                            if not x.startswith("ABLATE_RUNNER_PY=")))
    env = {k: v for k, v in os.environ.items() if k != "ABLATE_ASK"} | {"ABLATE_QUEUE": "manual"}

    def by_hand(spec_file: Path, name: str) -> int:
        cfg = lp.cfg(f"cfgs/a/{name}.yaml").split()[0]
        return subprocess.run(["bash", str(run_one), str(spec_file), name, cfg, "recon", "1", "a", "0"],
                              capture_output=True, env=env, timeout=60).returncode

    assert by_hand(bare, "nr") == 3
    assert not (lp.shared / "final_ckpts" / "nr").exists()
    failed = [e for e in events(lp, "h1", "manual") if e["ev"] == "sync_failed"]
    assert [e["cell"] for e in failed] == ["nr"] and "names no runner" in failed[0]["reason"], failed
    assert by_hand(spec, "hand") == 0
    assert json.loads((lp.shared / "final_ckpts" / "hand" / "MANIFEST.json").read_text())["name"] == "hand"
