"""Fault scenarios of the controller (tests/helpers/faults.py: each ends with every cell verified,
none run to completion twice, and the release gate closed until then): its local state deleted
mid-sweep (status rebuilds it from the shared FS), two `remediate --launch` at once (one acts, the
other finds nothing new), and a controller killed during `launch --all` (launched again, each
queue starts once)."""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.helpers.faults import Sweep, sweep_fixture
from tests.helpers.testbed_projects import sshfs_testbed
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

testbed = sshfs_testbed()
sweep = sweep_fixture()


def test_09_controller_state_deleted_mid_sweep(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    _, held = sw.queues["tb-h1"]
    sw.fault(held, "hang")  # the sweep is still mid-way while the local state goes
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done("tb-h1", held) >= 1, timeout=60)
    sw.ok("pull")
    assert (sw.proj / "results" / sw.name).is_dir()

    shutil.rmtree(sw.proj / "queues")
    shutil.rmtree(sw.proj / "results")
    st = sw.ok("status")
    assert st["roster"] == len(sw.cells)
    assert {r["queue"]: (r["host"], r["cells"]) for r in st["queues"]} == {
        h: (h, cs) for h, cs in sw.queues.items()}
    assert set(st["cells"]) == set(sw.cells)
    sw.assert_gate_closed("tb-h1")

    sw.clear(held, "hang")
    sw.wait_synced()
    rec = sw.ok("reconcile", "--fs")
    assert rec["complete"] and rec["roster"] == rec["verified"] == len(sw.cells), rec
    sw.finish()


def test_10_two_remediations_at_once(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep(queues=("tb-h1", "tb-h2"))
    never = sw.queues["tb-h3"]
    sw.ok("launch", "--all")
    sw.write_queue("tb-h3")  # cells added to the roster, never launched
    ran = [c for c in sw.cells if c not in never]
    sw.wait_synced(ran)
    sw.wait_states({c: "never_ran" for c in never})
    sw.assert_gate_closed("tb-h3")
    before = sw.queue_files()

    procs = [sw.popen("remediate", "--launch", "--json") for _ in range(2)]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        done.append((p.returncode, out, err))
    assert sorted(code for code, _, _ in done)[0] == 0, done
    for code, _, err in done:
        assert code == 0 or (code == 1 and "busy" in err and "held by" in err), done
    recs = sw.remediations()
    assert len(recs) == 1, (recs, [(c, o[-3000:], e[-3000:]) for c, o, e in done])
    [acted] = recs  # one wrote a queue; the other waited and found nothing new
    assert set(acted["cells"]) == set(never) and acted["queues"], acted
    assert sw.queue_files() - before == set(acted["queues"])

    sw.wait_synced()
    assert all(len(sw.evs("start", c)) == 1 for c in never)
    sw.ok("remediate")  # nothing changed since: nothing new
    assert sw.queue_files() - before == set(acted["queues"]) and len(sw.remediations()) == 1
    sw.finish()


def test_11_controller_killed_during_launch_all(testbed: Testbed, sweep: Callable[..., Sweep],
                                                tmp_path: Path) -> None:
    slow, stall = "tb-h3", tmp_path / "stall"
    sw = sweep(steal=True, ssh_extra=testbed.slow_link(slow, 0.2, stall))
    for cells in sw.queues.values():  # the queues that start stay live until the relaunch
        sw.fault(cells[0], "hang")
    ledgers, heartbeats = sw.root / "queues", sw.root / "heartbeats"
    proc = sw.popen("launch", "--all")
    try:
        # launch --all records every queue on the FS before it starts any: from then on the link
        # to `slow` stalls, so its start is in flight when the first queue elsewhere is running.
        wait_for(lambda: (ledgers.is_dir() and any(ledgers.glob("*.ledger"))) or proc.poll() is not None,
                 timeout=90, interval=0.005)
        stall.touch()
        wait_for(lambda: (heartbeats.is_dir() and any(heartbeats.iterdir())) or proc.poll() is not None,
                 timeout=60, interval=0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    time.sleep(0.5)  # a start that had reached its host shows now
    started = {h for h in testbed.hosts if sessions(testbed, h, sw.name)}
    assert started and slow not in started, started  # some started, some not
    sw.assert_gate_closed(sorted(started)[0])

    stall.unlink()
    sw.write_ssh_config()  # the link is well again
    again = sw.ok("launch", "--all")["launched"]
    status = {r["queue"]: r["status"] for r in again}
    assert {h: s for h, s in status.items() if h in started} == dict.fromkeys(started, "running")
    # The killed controller's start to `slow` is still in flight in its ssh connection (OpenSSH's
    # master outlives it) and may land before or during this launch: either one copy starts here
    # or this launch sees that one running; never two (counted below).
    assert {h: s for h, s in status.items() if h not in started} in (
        {slow: "launched"}, {slow: "running"}), (status, started)
    for cells in sw.queues.values():
        sw.clear(cells[0], "hang")
    sw.wait_synced()
    for q in sw.queues:
        assert len([e for e in sw.evs("queue_start") if e["queue"] == q]) == 1, q
    assert all(len(sw.evs("start", c)) == 1 for c in sw.cells)
    sw.finish()


def sessions(tb: Testbed, host: str, sweep: str) -> set[str]:
    """This sweep's tmux sessions on `host`, asked with the real ssh client."""
    # One word: ssh joins its arguments for the remote shell, which would take `#{...}` for a comment.
    p = subprocess.run(tb.ssh_argv(host, shlex.join(["tmux", "ls", "-F", "#{session_name}"])),
                       capture_output=True, text=True, timeout=30, check=False)
    return {s for s in p.stdout.split() if s.startswith(f"ablate-{sweep}-")}
