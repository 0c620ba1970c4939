"""Fault scenarios of the shared FS (tests/helpers/faults.py: each ends with every cell verified,
none run to completion twice, and the release gate closed until then): a host's sync to it fails
(the local checkpoint kept, the cells re-run elsewhere), a durable checkpoint truncated after its
sync (found `corrupt`, set aside, re-run), the storage server away for 20 s mid-queue (nothing
lost or re-run), and a network FS with NFS's default 60 s caches (doctor measures the lag and the
rules wait it out)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from safetensors.numpy import load_file

from tests.helpers.cli import Cli
from tests.helpers.faults import CKPT, DONE, Sweep, sweep_fixture
from tests.helpers.testbed_projects import sshfs_testbed
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

testbed = sshfs_testbed()
sweep = sweep_fixture()


def test_05_sync_to_the_shared_fs_fails(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    host = "tb-h2"
    mine = sw.queues[host]
    (sw.root / "final_ckpts").mkdir(parents=True)
    testbed.read_only(host, f"{testbed.shared_path}/ablate/{sw.name}/final_ckpts")
    sw.ok("launch", "--all")
    others = [c for c in sw.cells if c not in mine]
    sw.wait_synced(others)
    wait_for(lambda: all(sw.evs("end", c) for c in mine), timeout=30)
    for c in mine:
        assert [e["rc"] for e in sw.evs("end", c)] == [3], c
        assert len(sw.evs("sync_failed", c)) == 1
        # The instance-local checkpoint is kept, and it loads.
        assert int(load_file(str(sw.local_ckpt(host, c) / CKPT))["epoch"][0]) == 3
    sw.wait_states({**{c: "sync_failed" for c in mine}, **{c: DONE for c in others}})
    sw.assert_gate_closed(host)

    testbed.writable(host)  # the FS is fixed
    sw.ok("remediate", "--launch", "--hosts", "tb-h1")  # onto one host: one queue
    [record] = sw.remediations()
    assert record["cells"] == {c: "sync_failed" for c in mine}, record
    assert list(record["queues"].values()) == ["tb-h1"], record
    sw.finish(reran=tuple(mine))  # trained on tb-h2 (its copy failed), then again on tb-h1


def test_06_checkpoint_truncated_after_sync(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    sw.ok("launch", "--all")
    sw.wait_synced()
    bad = sw.cells[1]
    durable = sw.root / "final_ckpts" / bad / CKPT
    size = durable.stat().st_size
    with open(durable, "r+b") as f:
        f.truncate(size // 2)

    r = sw.cli("reconcile", "--fs", "--json")
    rec = r.json()
    assert r.code == 1 and not rec["complete"], r.output
    assert [c["name"] for c in rec["corrupt"]] == [bad] and rec["verified"] == len(sw.cells) - 1
    sw.cli("pull")
    r = sw.cli("reconcile")
    assert r.code == 1 and bad in r.output, r.output
    sw.assert_gate_closed("tb-h1")
    sw.wait_states({bad: "corrupt"})

    sw.ok("remediate", "--launch")
    [record] = sw.remediations()
    assert record["cells"] == {bad: "corrupt"}, record
    [aside] = list((sw.root / "final_ckpts").glob(f".aside.{bad}.*"))
    assert (aside / CKPT).stat().st_size == size // 2  # set aside, never deleted
    wait_for(lambda: len([e for e in sw.evs("end", bad) if e["rc"] == 0]) == 2, timeout=60)
    sw.finish(reran=(bad,))


def test_13_storage_outage_mid_queue(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    """The shared FS's server goes away for 20 s while every host is mid-cell (over sshfs, calls
    block and then fail with EIO until it is back): nothing lost, nothing run twice, every cell
    classified truthfully afterwards, and nothing for remediate to do."""
    assert testbed.shared == "sshfs"
    sw = sweep(epochs=3, step_time=0.5)
    firsts = {h: cs[0] for h, cs in sw.queues.items()}
    for c in firsts.values():
        sw.fault(c, "hang")  # every host mid-cell when the outage starts, however loaded the machine
    sw.ok("launch", "--all")
    wait_for(lambda: all(sw.epochs_done(h, c) >= 1 for h, c in firsts.items()), timeout=60)

    testbed.storage_down()
    began = time.monotonic()
    for c in firsts.values():
        sw.clear(c, "hang")  # (the backing dir: the server's own disk, written here)
    # The trainers go on (their checkpoints are on the local disks; the marker reads fail with EIO
    # and count as absent) and finish while the FS is away; then the outage lasts its 20 s. Each
    # marker read blocks until sshfs gives up (15-20 s for the first, a reconnect's 5 s for each
    # after it: about 40 s for the two epochs left), longer on a loaded machine.
    wait_for(lambda: all(sw.epochs_done(h, c) == 3 for h, c in firsts.items()), timeout=150)
    wait_for(lambda: time.monotonic() - began >= 20, timeout=30, interval=0.5)
    testbed.storage_up()

    sw.assert_gate_closed("tb-h1")
    sw.wait_synced(timeout=120)
    sw.wait_states(dict.fromkeys(sw.cells, DONE), timeout=60)
    assert sw.ok("remediate")["targets"] == {}
    # The trainers' own record: every cell trained once, to its end, on one host.
    for c in sw.cells:
        runs = [(h, e) for h in testbed.hosts for e in sw.trace(h, c) if e["ev"] == "start"]
        assert len(runs) == 1 and runs[0][1]["resume"] == 0, (c, runs)
        assert len(sw.evs("start", c)) == 1, (c, sw.evs("start", c))
    # The first cells' syncs waited for the FS and went through: no sync failure was recorded.
    assert not sw.evs("sync_failed"), sw.evs("sync_failed")
    sw.finish()


def test_14_default_nfs_like_caches_pass_doctor_and_the_sweep_holds(
        testbed_slowfs: Testbed, tmp_path: Path, cli: Cli) -> None:
    """The shared FS keeps the caches a default NFS mount keeps (sshfs `dcache_timeout=60`, as NFS's
    `acdirmax=60`): doctor passes with its default cap and records a lag of tens of seconds, and a
    sweep with a crashed cell, its remediation and the release gate holds on it (nothing lost,
    nothing run twice), the rules waiting out the measured lag."""
    from ablate.doctor.fs_lag import CAP, LONG

    sw = Sweep(testbed_slowfs, tmp_path, cli, "f14-slowfs")
    try:
        assert sw.doctor is not None, "the bed's first sweep runs doctor"
        assert sw.doctor.code == 0, sw.doctor.output
        lag = sw.doctor.json()["fs_lag"]
        assert lag["ok"] is True and LONG < lag["lag"] < CAP, lag  # real caches, within the cap
        assert all(p["new_file"] is not None and p["append"] is not None for p in lag["pairs"]), lag
        assert "dcache_timeout" in lag["warning"] and "near the cap" not in lag["warning"], lag["warning"]
        assert sw.lag_allowance() >= lag["lag"]

        bad, after_bad = sw.queues["tb-h2"]
        sw.fault(bad, "oom")
        sw.ok("launch", "--all")
        others = [c for c in sw.cells if c != bad]
        sw.wait_synced(others, timeout=300)
        assert [e["rc"] for e in sw.evs("end", bad)] == [137]
        sw.wait_states({bad: "oom", **{c: DONE for c in others}}, timeout=300)
        sw.assert_gate_closed("tb-h2")

        sw.clear(bad, "oom")  # the user fixes the cause
        rem = sw.ok("remediate", "--launch")
        assert [a for a in rem["advice"] if a.startswith(f"oom: {bad}:")], rem["advice"]
        [record] = sw.remediations()
        assert record["cells"] == {bad: "oom"}, record
        sw.wait_synced(timeout=300)
        assert sw.manifest(after_bad)["host"] == "tb-h2"
        sw.finish()
    finally:
        testbed_slowfs.heal()
        sw.close()
