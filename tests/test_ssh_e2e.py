"""The whole flow over real SSH on the 3-instance test bed (real sshd, real tmux, the real tiny
trainer, the shared FS over sshfs with its client caches), driven through `ablate.cli.main`, and a
link that drops while a queue runs (on the bind mount: there the FS stays)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from ablate.remote.layout import session_name
from ablate.transport import close_all
from ablate.transport.fanout import fan_out
from ablate.transport.ssh import SSHHost
from tests.helpers.cli import Cli
from tests.helpers.testbed_projects import CKPT, events, make_project, sshfs_testbed
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

testbed = sshfs_testbed({"test_a_dropped_link_does_not_stop_the_queue"})


def test_whole_flow_on_three_hosts(testbed: Testbed, tmp_path: Path, cli: Cli) -> None:
    sweep = "e2e"
    proj = make_project(testbed, tmp_path, sweep, cells=6, epochs=2, step_time=0.5)
    root = testbed.shared_dir / "ablate" / sweep
    try:
        if importlib.util.find_spec("ablate.doctor.command") is not None:
            r = cli(proj, "doctor")
            assert r.code == 0, r.output

        plan = cli.json(proj, "plan")
        queue_host = {q["queue"]: q["host"] for q in plan["queues"]}
        cell_host = {c: q["host"] for q in plan["queues"] for c in q["cells"]}
        assert sorted(queue_host.values()) == testbed.hosts and len(cell_host) == 6
        assert cli(proj, "deploy")[0] == 0

        launched = cli.json(proj, "launch", "--all")["launched"]
        assert {(r["queue"], r["host"], r["status"]) for r in launched} == {
            (q, h, "launched") for q, h in queue_host.items()}
        # Each queue's tmux session lives on its own host only (each instance has its own server).
        hosts = [SSHHost(h, ssh_config=str(tmp_path / "ssh_config")) for h in testbed.hosts]
        try:
            seen = fan_out(hosts, lambda h: {s for s in h.tmux_sessions()
                                             if s.startswith(f"ablate-{sweep}-")})
        finally:
            for h in hosts:
                h.close()
        assert {h.name: s for h, s in seen.items()} == {
            h: {session_name(sweep, h, q) for q, qh in queue_host.items() if qh == h} for h in testbed.hosts}

        running: set[str] = set()
        indices: dict[str, set[int]] = {q: set() for q in queue_host}

        def finished() -> bool:
            st = cli.json(proj, "status")
            assert st["unreachable"] == {}
            for row in st["queues"]:
                assert row["host"] == queue_host[row["queue"]]
                indices[row["queue"]].add(row["index"])
                if row["state"] == "running":
                    running.add(row["queue"])
            return all(r["state"] == "drained" and r["synced"] == r["total"] == 2 for r in st["queues"])

        wait_for(finished, timeout=120, interval=0.2)
        assert running == set(queue_host)  # each queue was seen running ...
        assert all(max(ix) == 2 for ix in indices.values())  # ... and reaching its end
        ended: dict[str, int] = {}
        for q, h in queue_host.items():
            evs = events(testbed, sweep, h, q)
            assert evs and {e["host"] for e in evs} == {h}
            for e in evs:
                if e["ev"] == "end" and e["rc"] == 0:
                    ended[e["cell"]] = ended.get(e["cell"], 0) + 1
            assert json.loads((root / "heartbeats" / f"{h}.{q}").read_text())["host"] == h
        # every cell trained to completion exactly once (a drained runner may have stolen one)
        assert ended == dict.fromkeys(cell_host, 1)

        # verified where they are, by a live host that mounts the FS, before pulling anything
        on_fs = cli.json(proj, "reconcile", "--fs", "--host", "tb-h2")
        assert on_fs["complete"] and on_fs["verified"] == 6 and on_fs["corrupt"] == []
        pulled = cli.json(proj, "pull")
        assert pulled["cells"] == 6 and pulled["failed"] == []
        rec = cli.json(proj, "reconcile")
        assert rec["complete"] and rec["verified"] == rec["roster"] == 6

        for name in cell_host:
            manifest = json.loads((root / "final_ckpts" / name / "MANIFEST.json").read_text())
            host = manifest["host"]  # the planned host, or a drained runner that stole the cell
            assert host in testbed.hosts
            durable = root / "final_ckpts" / name / CKPT
            assert durable.stat().st_size == manifest["artifacts"]["checkpoint"]["size"] > 0
            for other in testbed.hosts:  # written on the instance-local disk of its host only
                local = testbed.local_dir(other) / "ckpt" / sweep / name / CKPT
                assert local.exists() == (other == host), (name, other)
            ran_here = testbed.local_dir(host) / "ckpt" / sweep / name / CKPT
            assert ran_here.read_bytes() == durable.read_bytes()
            assert (proj / "results" / sweep / name / CKPT).read_bytes() == durable.read_bytes()

        for host in testbed.hosts:
            released = cli.json(proj, "release", host, "--yes")
            assert released["approved"] and released["host"] == host
            assert (root / "gate" / f"release.{host}.json").exists()
    finally:
        close_all()
        shutil.rmtree(testbed.shared_dir / "work" / sweep, ignore_errors=True)


def test_a_dropped_link_does_not_stop_the_queue(testbed: Testbed, tmp_path: Path,
                                                 cli: Cli) -> None:
    sweep, host, queue = "drop", "tb-h2", "q2"  # the FS is read through tb-h1
    proj = make_project(testbed, tmp_path, sweep, cells=3, epochs=3, step_time=0.7)
    cells = [f"c{i}" for i in range(3)]
    (proj / "queues").mkdir()
    (proj / "queues" / f"{queue}.txt").write_text(
        f"# ablate: host={host}\n" + "".join(f"configs/{sweep}/{c}.yaml recon\n" for c in cells))
    try:
        assert cli(proj, "launch", queue, "--host", host)[0] == 0
        wait_for(lambda: any(e["ev"] == "start" for e in events(testbed, sweep, host, queue)), timeout=30)

        testbed.link_down(host)
        ends_at_drop = sum(e["ev"] == "end" for e in events(testbed, sweep, host, queue))
        st = cli.json(proj, "status")
        assert set(st["unreachable"]) == {host} and st["via"] == "tb-h1"
        [row] = st["queues"]
        assert (row["host"], row["state"], row["live"]) == (host, "running", None)
        assert row["heartbeat_age"] is not None and row["heartbeat_age"] < 5
        r = cli(proj, "status")
        assert r.code == 0 and f"host {host} unreachable" in r.output and "alive" in r.output
        # The queue goes on while its host is cut off.
        wait_for(lambda: sum(e["ev"] == "end" for e in events(testbed, sweep, host, queue)) > ends_at_drop,
                 timeout=30)

        testbed.link_up(host)

        def drained() -> bool:
            st = cli.json(proj, "status")
            [row] = st["queues"]
            return st["unreachable"] == {} and row["state"] == "drained" and row["synced"] == 3

        wait_for(drained, timeout=60, interval=0.2)
        evs = events(testbed, sweep, host, queue)
        for kind in ("start", "end"):  # nothing re-ran
            assert sorted(e["cell"] for e in evs if e["ev"] == kind) == cells
        assert all(e["rc"] == 0 for e in evs if e["ev"] == "end")
    finally:
        close_all()
        shutil.rmtree(testbed.shared_dir / "work" / sweep, ignore_errors=True)
