"""`ablate remediate` on real sweeps (real tmux, the real tiny trainer, real checkpoints): identical
queue lines on live hosts, claims released on the record, idempotence, and `--launch` completing
the roster with no cell run to completion twice."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.errors import RemoteError
from ablate.transport.ssh import SSHHost
from ablate.transport.sshfs import SSHFS
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject, live
from tests.helpers.testbed_projects import sshfs_testbed
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py

testbed = sshfs_testbed()


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def states(cli: Cli, p: LocalProject) -> dict[str, str]:
    return {n: c["state"] for n, c in cli.json(p, "status")["cells"].items()}


def drained(p: LocalProject, host: str, queue: str) -> None:
    def done() -> bool:
        path = p.shared / "events" / f"{host}.{queue}.jsonl"
        return not live(host, queue) and path.exists() and '"queue_end"' in path.read_text()

    wait_for(done, timeout=60, interval=0.1)


def all_events(p: LocalProject) -> list[dict[str, Any]]:
    out = []
    for f in sorted((p.shared / "events").glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def body_lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_remediate_identical_lines_recorded_releases_idempotent_then_launch_completes(
        local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    p.write_config(steal=False)
    cfg = {n: p.cfg(f"cfgs/x/{n}.yaml", seed=i) for i, n in enumerate("ade")}
    cfg["b"] = p.cfg("cfgs/x/b.yaml", exit_code=1)
    cfg["c"] = p.cfg("cfgs/x/c.yaml", exit_code=137)
    # d saves every 1.5 s: a checkpoint that stays as it is for the keeper's second look (1 s) is
    # made durable while d runs (one rewritten every 0.25 s never settles: only a last look copies it)
    cfg["d"] = p.cfg("cfgs/x/d.yaml", step_time=1.5)
    original = {"a": f"{cfg['a']} recon", "b": f"{cfg['b']} recon 2", "c": f"{cfg['c']} recon",
                "d": f"{cfg['d']} recon 12", "e": f"{cfg['e']}  recon"}  # two spaces: kept as written
    p.queue("h1", ["# ablate: host=h1", original["a"], original["b"], original["c"]])
    p.queue("h2", ["# ablate: host=h2", original["d"], original["e"]])
    cli.json(p, "launch", "--all")
    drained(p, "h1", "h1")
    wait_for(lambda: states(cli, p)["d"] == "running", timeout=20)
    # d has saved a checkpoint and it is durable (resume/d/<n>/, committed while it runs): what its
    # remediated run resumes from, on either host, not resting on the stopped run's last look
    # (CI22: d remediated from scratch once, with nothing durable). On a loaded machine the
    # trainer's start alone can outlast the wait above.
    wait_for(lambda: any((p.shared / "resume" / "d").glob("*/RESUME.json")), timeout=60)
    cli.json(p, "stop", "h2", "--host", "h2")  # d cut mid-cell, e never reached
    assert states(cli, p) == {"a": "synced", "b": "crashed", "c": "oom", "d": "interrupted",
                                 "e": "never_ran"}

    out = cli.json(p, "remediate")
    assert {n: c["state"] for n, c in out["targets"].items()} == {
        "b": "crashed", "c": "oom", "d": "interrupted", "e": "never_ran"}
    assert not out["nothing_new"] and out["launched"] == []
    assert any(a.startswith("oom: c:") and "never changes a config" in a for a in out["advice"])
    written = {q["queue"]: q for q in out["queues"]}
    assert set(written) <= {"remediate-1-h1", "remediate-1-h2"} and written
    got_lines: dict[str, str] = {}
    for q, info in written.items():
        text = (p.root / "queues" / f"{q}.txt").read_text()
        assert text.splitlines()[0] == f"# ablate: host={info['host']}"  # the header plan writes
        for name, line in zip(info["cells"], body_lines(p.root / "queues" / f"{q}.txt"), strict=True):
            got_lines[name] = line
    assert got_lines == {n: original[n] for n in "bcde"}  # byte-identical original lines
    # Claims of claimed targets: renamed to released/ with the reason; never deleted.
    released = {Path(r).name.split(".")[0]: Path(r) for r in out["released"]}
    assert set(released) == {"b", "c", "d"}
    for name, path in released.items():
        assert path.parent == p.shared / "released" and not (p.shared / "claims" / name).exists()
        note = json.loads((path / "release.json").read_text())
        assert note["state"] == out["targets"][name]["state"] and note["reason"]
        assert (path / "owner").read_text().split()[:2] == ["h1" if name in "bc" else "h2",
                                                          "h1" if name in "bc" else "h2"]
    [record_path] = list((p.shared / "remediation").glob("*.json"))
    record = json.loads(record_path.read_text())
    assert record["cells"] == {"b": "crashed", "c": "oom", "d": "interrupted", "e": "never_ran"}
    assert record["queues"] == {q: info["host"] for q, info in written.items()}
    assert sorted(record["released"]) == sorted(out["released"]) and record["aside"] == []
    pending = states(cli, p)
    assert {n: pending[n] for n in "bcde"} == dict.fromkeys("bcde", "never_ran")

    # Nothing changed since: nothing new, nothing written.
    files = sorted(x.name for x in (p.root / "queues").iterdir())
    again = cli.json(p, "remediate")
    assert again["nothing_new"] and again["queues"] == [] and again["released"] == []
    assert set(again["pending"]) == set("bcde")
    assert sorted(x.name for x in (p.root / "queues").iterdir()) == files
    assert len(list((p.shared / "remediation").glob("*.json"))) == 1
    r = cli(p, "remediate")
    assert r.code == 0 and "nothing new to remediate" in r.output

    # The user fixes the causes (the same config files, so the same cells), then launches.
    for n in "bc":
        (p.root / cfg[n]).write_text(yaml.safe_dump({"lr": 0.1, "hidden": 4, "seed": 7}))
    out = cli.json(p, "remediate", "--launch")
    assert out["nothing_new"] and sorted(r["queue"] for r in out["launched"]) == sorted(written)
    assert all(r["status"] == "launched" for r in out["launched"])
    wait_for(lambda: all((p.shared / "final_ckpts" / n / "MANIFEST.json").exists() for n in "abcde"),
             timeout=90, interval=0.2)
    for q, info in written.items():
        drained(p, info["host"], q)
    assert cli.json(p, "pull")["failed"] == []
    rec = cli.json(p, "reconcile")
    assert rec["complete"] and rec["verified"] == 5
    ends = Counter(e["cell"] for e in all_events(p) if e["ev"] == "end" and e["rc"] == 0)
    assert ends == dict.fromkeys("abcde", 1)  # no cell ran to completion twice
    manifest = json.loads((p.shared / "final_ckpts" / "d" / "MANIFEST.json").read_text())
    # the interrupted cell went on from the checkpoint it left ({resume} 1: ablate/remote/resume/)
    assert manifest["resume"] == 1 and manifest["queue"].startswith("remediate-1-")
    assert states(cli, p) == dict.fromkeys("abcde", "verified")
    # Everything verified: a further remediate has nothing to do.
    assert cli.json(p, "remediate")["nothing_new"]


def test_corrupt_and_stale_results_are_set_aside_and_rerun(local_project: LocalProject,
                                                           cli: Cli) -> None:
    p = local_project
    p.write_config(steal=False, hosts={"h1": {"speed": 1.0}})
    a, b, c = (p.cfg(f"cfgs/y/{n}.yaml", seed=i) for i, n in enumerate("abc"))
    p.queue("h1", ["# ablate: host=h1", f"{a} recon", f"{b} recon", f"{c} recon"])
    cli.json(p, "launch", "h1", "--host", "h1")
    drained(p, "h1", "h1")
    ckpt = p.shared / "final_ckpts" / "a" / "model.safetensors"
    size = ckpt.stat().st_size
    with open(ckpt, "r+b") as f:
        f.truncate(size // 2)
    cli.json(p, "reconcile", "--fs", code=1)
    (p.root / b).write_text((p.root / b).read_text() + "lr2: 0.2\n")
    assert states(cli, p) == {"a": "corrupt", "b": "stale", "c": "verified"}

    out = cli.json(p, "remediate", "--launch")
    assert {n: t["state"] for n, t in out["targets"].items()} == {"a": "corrupt", "b": "stale"}
    aside = {Path(x).name.split(".")[2]: Path(x) for x in out["aside"]}
    assert set(aside) == {"a", "b"} and all(x.parent == p.shared / "final_ckpts" for x in aside.values())
    assert (aside["a"] / "model.safetensors").stat().st_size == size // 2  # kept, not deleted
    [q] = out["queues"]
    assert q["queue"] == "remediate-1-h1" and q["cells"] == ["a", "b"]
    drained(p, "h1", "remediate-1-h1")
    assert cli.json(p, "reconcile", "--fs")["complete"]
    new_b = json.loads((p.shared / "final_ckpts" / "b" / "MANIFEST.json").read_text())
    assert new_b["queue"] == "remediate-1-h1"
    # pull and reconcile skip the set-aside dirs (dot entries).
    pulled = cli.json(p, "pull")
    assert pulled["failed"] == [] and not list((p.root / "results" / "t1").glob(".aside*"))
    assert cli.json(p, "reconcile")["complete"]


def test_live_hosts_only_and_refusal_without_one(local_project: LocalProject,
                                                 cli: Cli) -> None:
    """A host that does not answer (an ssh host whose port refuses) gets nothing; with only it,
    remediate refuses (exit 1) naming it, and changes nothing."""
    p = local_project
    (p.root / "profiles").mkdir()
    (p.root / "profiles" / "gone.yaml").write_text(yaml.safe_dump(
        {"transport": "ssh", "shared_fs": "/nonexistent/fs", "ckpt_root": "/tmp/ckpt"}))
    ssh_config = p.root / "ssh_config"
    ssh_config.write_text("Host gone\n  HostName 127.0.0.1\n  Port 9\n  ConnectTimeout 2\n")
    p.write_config(steal=False, ssh_config=str(ssh_config), workdir=str(p.root),
                   hosts={"h1": {"speed": 1.0}, "gone": {"profile": "gone", "speed": 4.0}})
    x = p.cfg("cfgs/z/x.yaml")
    p.queue("gone", ["# ablate: host=gone", f"{x} recon"])
    got = cli.json(p, "status")["cells"]["x"]
    assert got["state"] == "never_ran" and "does not answer" in got["reason"] and "pending" not in got

    def files() -> dict[str, bytes]:  # the FS clock probe and the controller lock aside
        return {k: v for k, v in p.snapshot().items() if "/locks/" not in k and not k.endswith(".clock")}

    before = files()
    r = cli(p, "remediate", "--hosts", "gone", "--launch")
    assert r.code == 1 and "no live host" in r.output and "gone" in r.output
    assert files() == before

    out = cli.json(p, "remediate", "--launch")
    assert [q["queue"] for q in out["queues"]] == ["remediate-1-h1"] and "gone" in out["down"]
    drained(p, "h1", "remediate-1-h1")
    assert (p.shared / "final_ckpts" / "x" / "MANIFEST.json").exists()


def test_rename_noreplace_and_the_failure_snapshot_over_ssh(testbed: Testbed) -> None:
    """The two FS operations remediate and classification add, through a real sshd: a recorded
    rename that never replaces, and the snapshot's failure details computed on the host."""
    root = f"{testbed.shared_path}/ablate/rename"
    backing = testbed.shared_dir / "ablate" / "rename"
    fs = SSHFS(SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)), root)
    fs.write_atomic(f"{root}/claims/c1/owner", b"tb-h2 q2 0 1.5\n")
    fs.write_atomic(f"{root}/claims/c2/owner", b"tb-h2 q2 1 2.5\n")
    fs.write_atomic(f"{root}/tails/c1.log", b"epoch 1/3\nRuntimeError: CUDA out of memory. Tried\n")
    snap = fs.probe("snapshot", {"root": root})
    assert snap["tails"]["c1"]["oom"] == "RuntimeError: CUDA out of memory. Tried"
    assert snap["tails"]["c1"]["lines"][0] == "epoch 1/3" and snap["manifests"] == {}

    assert fs.rename_noreplace(f"{root}/claims/c1", f"{root}/released/c1.1.000") is True
    assert (backing / "released" / "c1.1.000" / "owner").read_text() == "tb-h2 q2 0 1.5\n"
    assert not (backing / "claims" / "c1").exists()
    assert fs.rename_noreplace(f"{root}/claims/c1", f"{root}/released/c1.2.000") is False  # gone
    with pytest.raises(RemoteError, match="exists"):
        fs.rename_noreplace(f"{root}/claims/c2", f"{root}/released/c1.1.000")
    assert (backing / "claims" / "c2" / "owner").exists()  # untouched
    assert fs.probe("snapshot", {"root": root})["released"] == {"c1": ["c1.1.000"]}
