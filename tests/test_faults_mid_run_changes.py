"""Fault scenarios where the user changes things under a running sweep (tests/helpers/faults.py:
each ends with every cell verified, none run to completion twice, and the release gate closed
until then): an upgraded ablate's wrapper fix deployed while the old run_queue runs (the live
queue keeps its bytes, new launches take the new one, `deploy --gc` waits for the old to drain),
and a queue file edited in the middle (a resume refused, naming the line, until it is put back)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.helpers.cli import REPO
from tests.helpers.faults import Sweep, sweep_fixture
from tests.helpers.testbed_projects import sshfs_testbed
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

testbed = sshfs_testbed()
sweep = sweep_fixture()


def test_07_wrapper_fix_deployed_mid_run(testbed: Testbed, sweep: Callable[..., Sweep],
                                         tmp_path: Path) -> None:
    sw = sweep(queues=("tb-h1", "tb-h2"))  # tb-h3's queue comes after the fix
    held, _ = sw.queues["tb-h1"]
    sw.fault(held, "hang")  # keeps the old queue live for as long as the test needs
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done("tb-h1", held) >= 1, timeout=30)
    hb = json.loads((sw.root / "heartbeats" / "tb-h1.tb-h1").read_text())
    old_name = hb["run_queue"]
    old_file = sw.root / "wrappers" / old_name
    old_bytes = old_file.read_bytes()
    assert old_name == f"run_queue.{hashlib.sha256(old_bytes).hexdigest()[:12]}.sh"

    # The "fix": an upgraded ablate whose run_queue differs, deployed by a second controller. Laid
    # out as an installed ablate is (setup.cfg maps wrappers/ and profiles/ into the package).
    pkg = tmp_path / "upgraded"
    shutil.copytree(REPO / "ablate", pkg / "ablate", ignore=shutil.ignore_patterns("__pycache__"))
    for d in ("wrappers", "profiles"):
        shutil.copytree(REPO / d, pkg / "ablate" / d, ignore=shutil.ignore_patterns("__pycache__"))
    fixed = old_bytes + b"# a fix, deployed while the old version runs\n"
    (pkg / "ablate" / "wrappers" / "run_queue.sh").write_bytes(fixed)
    dep = sw.run("deploy", "--json", pythonpath=pkg)
    assert dep.returncode == 0, dep.stderr
    new_name = json.loads(dep.stdout)["run_queue"]
    assert new_name != old_name and (sw.root / "wrappers" / new_name).read_bytes() == fixed

    # The live queue keeps reading the old file, byte for byte.
    assert old_file.read_bytes() == old_bytes
    cmdline = Path(f"/proc/{hb['pid']}/cmdline").read_bytes().split(b"\0")
    assert str(old_file).replace(str(testbed.shared_dir), testbed.shared_path).encode() in cmdline
    # New launches use the new one.
    sw.write_queue("tb-h3")
    got = sw.run("launch", "tb-h3", "--host", "tb-h3", "--json", pythonpath=pkg)
    assert got.returncode == 0, got.stderr
    wait_for(lambda: [e for e in sw.evs("queue_start") if e["queue"] == "tb-h3"], timeout=20)
    [start] = [e for e in sw.evs("queue_start") if e["queue"] == "tb-h3"]
    assert start["run_queue"] == new_name

    gc = sw.run("deploy", "--gc", "--json", pythonpath=pkg)
    assert gc.returncode == 1, (gc.stdout, gc.stderr)
    assert ("tb-h1" in gc.stderr or old_name in gc.stderr) and old_file.read_bytes() == old_bytes
    sw.assert_gate_closed("tb-h1")

    sw.clear(held, "hang")
    sw.wait_synced()
    wait_for(lambda: json.loads((sw.root / "heartbeats" / "tb-h1.tb-h1").read_text())["state"] == "drained",
             timeout=20)
    gc = sw.run("deploy", "--gc", "--json", pythonpath=pkg)
    assert gc.returncode == 0, (gc.stdout, gc.stderr)
    assert not old_file.exists() and (sw.root / "wrappers" / new_name).exists()
    old_v, new_v = old_name.split(".")[1], new_name.split(".")[1]
    for c in sw.cells:
        assert sw.manifest(c)["run_queue_version"] == (new_v if c in sw.queues["tb-h3"] else old_v), c
    sw.finish()


def test_08_queue_file_edited_in_the_middle(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    first, second = sw.queues["tb-h2"]
    sw.fault(first, "hang")  # holds it mid-cell until stopped
    sw.ok("launch", "--all")
    wait_for(lambda: sw.epochs_done("tb-h2", first) >= 1, timeout=30)
    sw.ok("stop", "tb-h2", "--host", "tb-h2")
    sw.clear(first, "hang")

    qfile = sw.proj / "queues" / "tb-h2.txt"
    original = qfile.read_text()
    lines = original.splitlines(keepends=True)
    gone = next(i for i, ln in enumerate(lines) if ln.startswith(sw.cfg(first)))
    qfile.write_text("".join(lines[:gone] + lines[gone + 1:]))
    ledger = (sw.root / "queues" / "tb-h2.ledger").read_bytes()
    launched = (sw.root / "queues" / "tb-h2.txt").read_bytes()

    r = sw.cli("launch", "tb-h2", "--host", "tb-h2")
    assert r.code == 2, r.output
    assert f"queues/tb-h2.txt:{gone + 1}" in r.output and lines[gone].strip() in r.output, r.output
    assert (sw.root / "queues" / "tb-h2.ledger").read_bytes() == ledger  # nothing changed
    assert (sw.root / "queues" / "tb-h2.txt").read_bytes() == launched
    sw.assert_gate_closed("tb-h2")

    qfile.write_text(original)  # put back: resume is allowed again
    resumed = sw.ok("launch", "tb-h2", "--host", "tb-h2")
    assert resumed["resumed"] and resumed["start_index"] == gone, resumed
    sw.wait_synced()
    assert [e["resume"] for e in sw.evs("start", first)] == [0, 1]
    assert [e["resume"] for e in sw.evs("start", second)] == [0]
    sw.finish()
