"""Fault scenarios where an instance or its link goes away mid-cell (tests/helpers/faults.py: each
ends with every cell verified, none run to completion twice, and the release gate closed until
then): an instance killed (its cells `lost`, re-run elsewhere by remediate, the cut one from its
durable resume copy), a link that drops
and heals (a fresh heartbeat is not lost: nothing re-runs), an instance that reboots (its cut
cell resumes from its last checkpoint on the local disk)."""

from __future__ import annotations

import json
from collections.abc import Callable

from safetensors.numpy import load_file

from tests.helpers.faults import CKPT, DONE, Sweep, sweep_fixture
from tests.helpers.testbed_projects import sshfs_testbed
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

testbed = sshfs_testbed({"test_02_link_drops_mid_queue_and_heals"})
sweep = sweep_fixture()


def test_01_instance_killed_mid_cell(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    victim = "tb-h3"  # the shared FS is read through tb-h1
    cut, unstarted = sw.queues[victim]
    sw.fault(cut, "hang")  # holds it mid-cell, however loaded the machine
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done(victim, cut) >= 1, timeout=30)

    # Its epoch-1 checkpoint made durable on the sweep while it runs (ablate/remote/resume/)
    wait_for(lambda: list((sw.root / "resume" / cut).glob("[0-9]*/RESUME.json")), timeout=30)
    testbed.kill(victim)  # the instance and its disk gone
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
    for c in (cut, unstarted):  # re-run elsewhere with the same config: the cut one resumes from
        m = sw.manifest(c)       # its durable copy, the other from scratch
        assert m["host"] != victim and m["resume"] == (c == cut) and m["cfg"] == sw.cfg(c)
    [restored] = sw.evs("restore", cut)
    assert restored["from"] == "copy" and restored["made_on"] == victim and restored["host"] != victim
    [start] = [e for e in sw.trace(restored["host"], cut) if e["ev"] == "start"]
    assert start["start_epoch"] >= 1, start  # the work done on the dead instance is not done again
    assert not sw.evs("restore", unstarted)
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
