"""Autostop's decision (ablate/remote/host/autostop.py) in milliseconds: an instance stops only when
nothing runs or is left for it, everything it published is verified, it is not kept for
remediation, and its idle time has passed; the keepers are elected once, on the sweep's storage."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

from ablate.remote.host.autostop import Facts, Settings, decide, elect, elect_once, gather_fs, unverified_of

ON = Settings(idle=600, command="shutdown -h now", keep=1)
T = 1_800_000_000.0


def facts(**kw: object) -> Facts:
    base: dict[str, object] = {"now": T, "host": "h1", "last_work": T - 601}
    base.update(kw)
    return Facts(**base)  # type: ignore[arg-type]


def test_it_stops_only_when_everything_holds() -> None:
    v = decide(ON, facts())
    assert v.stop and v.kind == "stop" and v.stop_at == T - 1
    assert decide(None, facts()).kind == "off"
    assert decide(ON, facts(cancelled=True)).why == "autostop cancelled"


def test_what_it_waits_for_in_order() -> None:
    everything = {"running": ["q1"], "unverified": {"c3": "hash mismatch"}, "waiting": ["c9"],
                  "keepers": ["h1"], "last_work": T - 10}
    order = ["running", "unverified", "kept", "idle"]
    dropped = ["running", "unverified", "waiting"]
    for i, kind in enumerate(order):
        kw = {k: v for k, v in everything.items() if k not in dropped[:i]}
        v = decide(ON, facts(**kw))
        assert v.kind == kind and not v.stop, (kind, v)
    assert decide(ON, facts(running=["q2", "q1"])).why == "running cells: q1 q2"
    assert decide(ON, facts(unverified={"c4": "hash mismatch", "c2": "missing"})).why.startswith(
        "unverified result: c2 (missing) (+1 more): its disk may hold the only good copy")
    other = decide(ON, facts(others=["/mnt/fs/ablate/sweep-b"]))
    assert other.kind == "running"
    assert other.why == "another sweep's queue runs on this instance (/mnt/fs/ablate/sweep-b)"
    idle = decide(ON, facts(last_work=T - 240))
    assert idle.why == "stops in 6 min" and idle.stop_at == T + 360


def test_remediation_keeps_the_elected_only_and_waits_for_the_election() -> None:
    waiting = {"waiting": ["c5"]}
    assert decide(ON, facts(keepers=["h2"], **waiting)).stop  # h2 stays, h1 may go
    kept = decide(ON, facts(keepers=["h1"], **waiting))
    assert kept.kind == "kept" and kept.why.startswith("kept for remediation: 1 cell(s)")
    undecided = decide(ON, facts(keepers=None, **waiting))
    assert undecided.kind == "kept" and "not decided yet" in undecided.why
    assert decide(ON, facts(keepers=["h1"])).stop  # nothing waits: the keeper stops too


def test_elect_fastest_ties_by_name() -> None:
    speeds = {"b": 2.0, "a": 2.0, "c": 3.0, "d": 1.0}
    assert elect(speeds, 1) == ("c",)
    assert elect(speeds, 3) == ("c", "a", "b")
    assert elect(speeds, 0) == () and elect({}, 1) == ()


def test_elect_once_decides_once_among_racers(tmp_path: Path) -> None:
    path = str(tmp_path / "autostop" / "keep.json")
    got: dict[str, tuple[str, ...]] = {}
    speeds = {"h1": 1.0, "h2": 2.0, "h3": 1.5}

    def racer(host: str, keep: int) -> None:
        got[host] = elect_once(path, speeds, keep, host, T)

    threads = [threading.Thread(target=racer, args=(h, k)) for h, k in (("h1", 1), ("h2", 2), ("h3", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got.values())) == 1  # everyone reads the same answer
    rec = json.loads(Path(path).read_text())
    assert tuple(rec["hosts"]) == got["h1"] and rec["by"] in speeds
    assert not [n for n in os.listdir(tmp_path / "autostop") if n.endswith(".tmp")]
    # speeds changed since: the decision stands
    assert elect_once(path, {"h1": 9.0, "h2": 1.0}, 1, "h1", T + 5) == got["h1"]


def test_an_unreadable_election_keeps_everyone(tmp_path: Path) -> None:
    path = tmp_path / "keep.json"
    path.write_text("{not json\n")
    assert elect_once(str(path), {"h1": 1.0, "h2": 2.0}, 1, "h1", T) == ("h1", "h2")


TASKS = {"recon": 1}


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def sweep_root(root: Path) -> Path:
    """Two hosts' queues: h1's q1 (c1 published, c2 crashed after its claim), h2's q2 (c3 running
    on it, c4 unclaimed), with a comment and an invalid line."""
    (root / "queues").mkdir(parents=True)
    for q, h, lines in (("q1", "h1", ["# two cells", "cfgs/c1.yaml recon", "cfgs/c2.yaml recon"]),
                        ("q2", "h2", ["cfgs/c3.yaml recon", "cfgs/c4.yaml recon", "not a line at all x y"])):
        (root / "queues" / f"{q}.txt").write_text("".join(x + "\n" for x in lines))
        launch = {"op": "launch", "host": h, "start_index": 0}
        (root / "queues" / f"{q}.ledger").write_text(json.dumps(launch) + "\n")
    for c, owner in (("c1", "h1 q1 1 1.0 - -"), ("c2", "h1 q1 2 2.0 - -"), ("c3", "h2 q2 0 3.0 - -")):
        (root / "claims" / c).mkdir(parents=True)
        (root / "claims" / c / "owner").write_text(owner + "\n")
    (root / "final_ckpts" / "c1").mkdir(parents=True)
    (root / "final_ckpts" / "c1" / "MANIFEST.json").write_text("{}\n")
    (root / "heartbeats").mkdir()
    gone = _dead_pid()
    (root / "heartbeats" / "h1.q1").write_text(json.dumps({"state": "drained", "pid": gone}) + "\n")
    (root / "heartbeats" / "h2.q2").write_text(json.dumps({"state": "running", "pid": gone}) + "\n")
    (root / "events").mkdir()
    (root / "events" / "h1.q1.jsonl").write_text("{}\n")
    for p in (root / "queues" / "q1.txt", root / "queues" / "q1.ledger", root / "events" / "h1.q1.jsonl"):
        os.utime(p, (T - 900, T - 900))
    os.utime(root / "events" / "h1.q1.jsonl", (T - 700, T - 700))
    return root


def test_gather_what_a_drained_instance_sees(tmp_path: Path) -> None:
    root = str(sweep_root(tmp_path / "sweep"))
    os.utime(Path(root) / "heartbeats" / "h2.q2", (T - 5, T - 5))  # h2's queue beat just now
    f = gather_fs(root, "h1", T, tasks=TASKS)
    # c2 crashed after its claim (q1 drained): it waits; c4, not reached yet by h2's live queue, does not
    assert (list(f.running), list(f.waiting)) == ([], ["c2"])
    assert f.last_work == T - 700  # its events file, the newest of its queue's files
    assert decide(ON, f).kind == "kept"  # nobody elected yet
    assert decide(ON, gather_fs(root, "h1", T, tasks=TASKS, keepers=["h2"])).stop
    # h2: its queue runs when its process is alive here
    f2 = gather_fs(root, "h2", T, tasks=TASKS)
    assert list(f2.running) == []  # its process is gone
    hb = Path(root) / "heartbeats" / "h2.q2"
    hb.write_text(json.dumps({"state": "running", "pid": os.getpid()}) + "\n")
    os.utime(hb, (T - 5, T - 5))
    assert list(gather_fs(root, "h2", T, tasks=TASKS).running) == ["q2"]


def test_lines_no_running_queue_will_take_wait_for_remediate(tmp_path: Path) -> None:
    """Lines of a queue that no longer runs (its instance gone, or stopped) wait for remediate,
    unless a queue that runs lists them too (a remediation queue)."""
    root = sweep_root(tmp_path / "sweep")
    os.utime(root / "heartbeats" / "h2.q2", (T - 5, T - 5))
    assert list(gather_fs(str(root), "h1", T, tasks=TASKS).waiting) == ["c2"]
    os.utime(root / "heartbeats" / "h2.q2", (T - 31, T - 31))  # its instance went away
    # c3 claimed by a queue gone silent (lost), c4 never claimed and nobody left to take it
    assert list(gather_fs(str(root), "h1", T, tasks=TASKS, fresh=30).waiting) == ["c2", "c3", "c4"]
    (root / "queues" / "rq1.txt").write_text("cfgs/c4.yaml recon\n")  # remediate put c4 on h1
    (root / "queues" / "rq1.ledger").write_text(json.dumps({"op": "launch", "host": "h1"}) + "\n")
    os.utime(root / "queues" / "rq1.ledger", (T - 10, T - 10))  # launched, starting
    f = gather_fs(str(root), "h1", T, tasks=TASKS, fresh=30)
    assert list(f.waiting) == ["c2", "c3"] and list(f.running) == ["rq1"]


def test_a_sweep_that_cannot_be_listed_decides_nothing(tmp_path: Path) -> None:
    import pytest

    from ablate.remote.host.autostop import Unsure

    with pytest.raises(Unsure):
        gather_fs(str(tmp_path / "not-mounted"), "h1", T, tasks=TASKS)


def test_gather_a_launch_not_started_yet_counts_as_running_for_a_while(tmp_path: Path) -> None:
    root = sweep_root(tmp_path / "sweep")
    (root / "heartbeats" / "h1.q1").unlink()
    os.utime(root / "queues" / "q1.ledger", (T - 60, T - 60))
    assert list(gather_fs(str(root), "h1", T, tasks=TASKS).running) == ["q1"]
    os.utime(root / "queues" / "q1.ledger", (T - 3600, T - 3600))  # its start failed long ago
    assert list(gather_fs(str(root), "h1", T, tasks=TASKS).running) == []


def publish_result(root: Path, name: str, host: str) -> Path:
    """A result as run_one publishes it (ablate/remote/queue/publish.py), its checkpoint written by
    safetensors."""
    import numpy as np
    from safetensors.numpy import save_file

    from ablate.remote.queue import publish

    ckpt = root.parent / "ckpt" / name
    ckpt.mkdir(parents=True)
    save_file({"w": np.arange(64, dtype=np.float32)}, str(ckpt / "model.safetensors"))
    log = root.parent / "ckpt" / f"{name}.log"
    log.write_text("# trained\n")
    final = root / "final_ckpts" / name
    final.mkdir(parents=True)
    rc = publish.main([f"--staging={final}", f"--ckpt-dir={ckpt}", f"--log={log}",
                       "--checkpoint=model.safetensors", f"--workdir={root.parent}", f"--host={host}",
                       "--queue=q1", "--started=1.5", "--ended=2.5", "--", name, f"cfgs/{name}.yaml",
                       "recon", "1", "cfgs", "0"])
    assert rc == 0
    return final


def test_unverified_of_checks_its_own_results_once_per_manifest(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    mine, theirs = publish_result(root, "c1", "h1"), publish_result(root, "c2", "h2")
    artifacts: dict[str, object] = {"checkpoint": "model.safetensors"}
    cache: dict[str, str | None] = {}
    assert unverified_of(str(root), "h1", artifacts, cache) == {} and list(cache.values()) == [None]
    data = bytearray((mine / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # a flipped byte
    (mine / "model.safetensors").write_bytes(bytes(data))
    assert unverified_of(str(root), "h1", artifacts, cache) == {}  # the same manifest: not read again
    bad = unverified_of(str(root), "h1", artifacts, {})
    assert list(bad) == ["c1"] and "sha256" in bad["c1"], bad
    again: dict[str, str | None] = {}
    assert list(unverified_of(str(root), "h1", artifacts, again)) == ["c1"] and again == {}
    data[-1] ^= 0xFF  # mended in place: verified at the next look
    (mine / "model.safetensors").write_bytes(bytes(data))
    assert unverified_of(str(root), "h1", artifacts, again) == {} and len(again) == 1
    (theirs / "model.safetensors").write_bytes(b"x")  # another host's result is not h1's to check
    assert unverified_of(str(root), "h1", artifacts, {}) == {}
    f = facts(unverified=bad)
    assert decide(ON, f).kind == "unverified" and "c1" in decide(ON, f).why
