"""A real Hugging Face `Trainer` on the Slurm bed (tests/slurmbed.py) whose node dies mid-run, with
`ckpt_root` on each node's own disk: Slurm requeues the job onto another node, where nothing of
the cell is, and the trainer resumes from the durable copy of its `checkpoint-N/` that the queue
made on the shared FS while it trained (ablate/remote/resume/), not from step 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import Cli
from tests.helpers.slurm_jobs import ev as _ev
from tests.helpers.slurm_jobs import slurm_env_fixture
from tests.helpers.slurm_sweep import Sweep
from tests.slurmbed import SlurmBed

pytestmark = pytest.mark.usefixtures("_slurm_env")
_slurm_env = slurm_env_fixture()


def test_a_hf_trainer_whose_node_dies_resumes_on_another_node_from_its_durable_copy(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=1, queues=1, epochs=1, step_time=0.0, node_local=True,
               trainer=(Path(__file__).parent / "helpers" / "hf_resume_train.py", "--steps 8",
                        "trainer/checkpoint-*"))
    (sw.work / "faults").mkdir()
    (sw.work / "faults" / "c0.hold").write_text("4\n")  # held after the save of checkpoint-4
    sw.ok("plan")
    sw.ok("launch", "--all")
    copies = sw.root / "resume" / "c0"

    def durable_step() -> bool:
        recs = [json.loads(r.read_text()) for r in copies.glob("[0-9]*/RESUME.json")]
        return max((r["step"] or 0 for r in recs), default=0) >= 4

    sw.wait_until(durable_step, timeout=180, interval=0.5)
    [job] = sw.jobs()
    node = job["nodes"]
    slurm_cluster.node_kill(node)  # the node and its disk's checkpoint are gone with it
    (sw.work / "faults" / "c0.hold").unlink()
    sw.wait_done(timeout=300)
    restored = _ev(sw, "restore", cell="c0")
    assert [(e["from"], e["step"]) for e in restored] == [("copy", 4)], restored
    starts = [e for e in sw.events() if e["ev"] == "queue_start"]
    assert starts[0]["node"] == node and starts[-1]["node"] != node, starts
    ran = [e for e in sw.trace("c0") if e["ev"] == "start"]  # every node's disk, in time order
    assert [(e["resumed"], e["first_step"]) for e in ran] == [(False, 0), (True, 4)], ran
    manifest = json.loads((sw.root / "final_ckpts" / "c0" / "MANIFEST.json").read_text())
    assert manifest["resume"] == 1, manifest
    assert sw.ok("reconcile", "--fs")["complete"] is True
    assert not copies.exists(), "a published cell's copies are removed"
