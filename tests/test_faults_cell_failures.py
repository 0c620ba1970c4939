"""Fault scenarios where a cell itself fails (tests/helpers/faults.py: each ends with every cell
verified, none run to completion twice, and the release gate closed until then): an OOM-killed
cell, classified `oom` and re-run by `remediate --launch` with its identical queue line once the
cause is fixed; a hung cell, flagged `hung`, left alone by remediate until stopped, then re-run."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from tests.helpers.faults import DONE, Sweep, sweep_fixture
from tests.helpers.testbed_projects import sshfs_testbed
from tests.testbed import Testbed

testbed = sshfs_testbed()
sweep = sweep_fixture()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_03_oom_cell_remediated_after_the_cause_is_fixed(testbed: Testbed,
                                                        sweep: Callable[..., Sweep]) -> None:
    sw = sweep()
    bad, after_bad = sw.queues["tb-h2"]
    cfg_sha = sha256(sw.proj / sw.cfg(bad))
    sw.fault(bad, "oom")
    sw.ok("launch", "--all")
    others = [c for c in sw.cells if c != bad]
    sw.wait_synced(others)  # the queue went on past the OOM; the other hosts never noticed
    assert [e["rc"] for e in sw.evs("end", bad)] == [137]
    sw.wait_states({bad: "oom", **{c: DONE for c in others}})
    assert "epoch 1/3" in (sw.root / "tails" / f"{bad}.log").read_text()
    sw.assert_gate_closed("tb-h2")

    sw.clear(bad, "oom")  # the user fixes the cause, not the config
    rem = sw.ok("remediate", "--launch")
    assert [a for a in rem["advice"] if a.startswith(f"oom: {bad}:")], rem["advice"]
    [record] = sw.remediations()
    assert record["cells"] == {bad: "oom"}, record
    [new_queue] = record["queues"]
    lines = [ln for ln in (sw.proj / "queues" / f"{new_queue}.txt").read_text().splitlines()
             if not ln.startswith("#")]
    assert lines == [f"{sw.cfg(bad)} recon"], lines  # the identical queue line
    sw.wait_synced()
    m = sw.manifest(bad)
    assert (m["cfg"], m["task"], m["epochs"], m["cfg_sha256"]) == (sw.cfg(bad), "recon", 3, cfg_sha)
    assert sha256(sw.proj / sw.cfg(bad)) == cfg_sha
    assert sw.manifest(after_bad)["host"] == "tb-h2"
    sw.finish()


def test_04_hung_cell_stopped_and_remediated(testbed: Testbed, sweep: Callable[..., Sweep]) -> None:
    sw = sweep(monitor={"hung_after": "3s"})
    bad, unstarted = sw.queues["tb-h2"]
    sw.fault(bad, "hang")
    sw.ok("launch", "--all")
    others = [c for c in sw.cells if c not in (bad, unstarted)]
    sw.wait_states({bad: "hung"}, timeout=45)
    sw.assert_gate_closed("tb-h2")
    rem = sw.ok("remediate")  # a hung cell is not re-run while it holds its queue: stop it first
    assert rem["nothing_new"] and not sw.remediations() and bad in rem["hung"], rem
    assert any("ablate stop tb-h2 --host tb-h2" in a for a in rem["advice"]), rem["advice"]

    stopped = sw.ok("stop", "tb-h2", "--host", "tb-h2")
    assert stopped["was_live"] and stopped["signal"] in ("TERM", "KILL"), stopped
    sw.clear(bad, "hang")
    assert not [e for e in sw.evs("end", bad) if e["rc"] == 0]  # cut, not counted done
    sw.wait_synced(others)
    sw.wait_states({bad: "interrupted", unstarted: "never_ran"}, timeout=20)

    sw.ok("remediate", "--launch", "--hosts", "tb-h3")  # onto one host: one queue
    [record] = sw.remediations()
    assert record["cells"] == {bad: "interrupted", unstarted: "never_ran"}, record
    assert list(record["queues"].values()) == ["tb-h3"], record
    assert [p.name.split(".")[0] for p in (sw.root / "released").iterdir()] == [bad]
    sw.finish()
