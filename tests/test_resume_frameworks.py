"""Real trainers whose queue is taken away mid-run with its disk, as a spot instance is: a Hugging
Face `Trainer` (tests/helpers/hf_resume_train.py: `save_steps`, `save_total_limit`,
`train(resume_from_checkpoint=True)`) killed at once, and a Lightning run
(tests/helpers/lightning_resume_train.py: `ModelCheckpoint(save_last="link")`, `fit(ckpt_path=
"last")`) sent TERM then KILL 5 s later, as RunPod stops a spot pod. `remediate --launch` runs the
cell again, its newest durable copy is restored into the new {ckpt_dir} (ablate/remote/resume/),
and the library goes on from there instead of from zero (real tmux, real files, the libraries' own
checkpoints)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject, live
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py
# The trainers by path: importing them (torch, transformers, lightning) costs every collection 7 s.
HF_TRAIN = Path(__file__).parent / "helpers" / "hf_resume_train.py"
LIGHTNING_TRAIN = Path(__file__).parent / "helpers" / "lightning_resume_train.py"


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def _trace(ckpt: Path) -> list[dict[str, object]]:
    path = ckpt / "trace.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _launched(p: LocalProject, cli: Cli, trainer: str, length: str, checkpoint: str, hold: int,
              **settings: object) -> Path:
    """`trainer` copied into the project, one cell c1 launched on h1, held at `hold` (its
    `faults/c1.hold`); the cell's resume copies' directory."""
    shutil.copyfile(trainer, p.root / "trainer.py")
    p.write_config(
        steal=False,
        train=f"{sys.executable} trainer.py --config {{cfg}} --out {{ckpt_dir}} --resume {{resume}} "
              f"{length} --name {{name}}",
        artifacts={"checkpoint": checkpoint, "pick": "newest", "metrics": "metrics.json",
                   "metrics_keys": ["val_loss"]}, **settings)
    (p.root / "faults").mkdir()
    (p.root / "faults" / "c1.hold").write_text(f"{hold}\n")
    p.queue("h1", ["# ablate: host=h1", f"{p.cfg('cfgs/c1.yaml')} recon"])
    cli.json(p, "launch", "h1", "--host", "h1")
    return p.shared / "resume" / "c1"


def test_a_killed_hf_trainer_resumes_elsewhere_from_its_durable_checkpoint(local_project: LocalProject,
                                                                           cli: Cli) -> None:
    p = local_project
    copies = _launched(p, cli, str(HF_TRAIN), "--steps 8", "trainer/checkpoint-*", hold=4,
                       budget={"ckpt_size": "20MB", "scratch": "50MB"})  # held after checkpoint-4

    def durable_step() -> object:
        recs = [json.loads(r.read_text()) for r in copies.glob("[0-9]*/RESUME.json")]
        return max((r["step"] for r in recs), default=0) >= 4

    wait_for(durable_step, timeout=120, interval=0.2)
    # The instance goes: every process of its queue killed at once, its disk with them.
    hb = json.loads((p.shared / "heartbeats" / "h1.h1").read_text())
    os.killpg(hb["pgid"], signal.SIGKILL)
    wait_for(lambda: not live("h1", "h1"), timeout=30)
    h1_ckpt = p.root / ".ablate" / "local" / "h1" / "ckpt"
    shutil.rmtree(h1_ckpt / "c1")
    (p.root / "faults" / "c1.hold").unlink()

    # Before it runs again, status and remediate say what it will resume from.
    said = cli.json(p, "status")["resume"]["c1"]
    assert said["from"] == "copy" and said["step"] == 4 and said["made_on"] == "h1", said
    assert said["what"] == "trainer", said
    fix = cli.json(p, "remediate", "--launch")
    assert fix["targets"]["c1"]["state"] in ("interrupted", "lost"), fix
    assert fix["resume"]["c1"]["from"] == "copy" and fix["resume"]["c1"]["step"] == 4, fix["resume"]
    wait_for(lambda: (p.shared / "final_ckpts" / "c1" / "MANIFEST.json").exists(), timeout=180, interval=0.3)
    manifest = json.loads((p.shared / "final_ckpts" / "c1" / "MANIFEST.json").read_text())
    host = manifest["host"]
    ckpt = p.root / ".ablate" / "local" / host / "ckpt" / "c1"
    [start] = _trace(ckpt)  # the run after the kill, on a disk that held nothing of the cell
    assert start["resumed"] is True and start["first_step"] == 4, start
    assert manifest["resume"] == 1
    assert json.loads((ckpt / "metrics.json").read_text())["global_step"] == 8
    events = [json.loads(ln) for f in (p.shared / "events").glob("*.jsonl")
              for ln in f.read_text().splitlines()]
    [restored] = [e for e in events if e["ev"] == "restore"]
    assert restored["from"] == "copy" and restored["step"] == 4 and restored["made_on"] == "h1", restored
    log = (ckpt.parent / "c1.log").read_text()
    assert "restored durable copy" in log and "step 4" in log, log[-2000:]
    rec = cli.json(p, "reconcile", "--fs")
    assert rec["complete"] is True, rec
    assert not list(copies.glob("[0-9]*")), "a published cell's copies are removed"
    # each attempt and the work the kill lost: what the first run did after checkpoint-4 was written
    tried = cli.json(p, "status")["attempts"]["c1"]
    assert tried["runs"] == 2 and tried["cut"] == 1 and 0 < tried["lost_secs"] < 120, tried


def test_a_lightning_run_stopped_as_a_spot_pod_resumes_from_its_last_link(local_project: LocalProject,
                                                                         cli: Cli) -> None:
    p = local_project
    copies = _launched(p, cli, str(LIGHTNING_TRAIN), "--epochs 5", "ckpts/epoch=*.ckpt", hold=2,
                       budget={"ckpt_size": "1MB", "scratch": "10MB"},  # held as epoch 2 starts
                       resume="ckpts/last.ckpt")  # a link to the newest epoch's file

    def durable() -> object:
        recs = [json.loads(r.read_text()) for r in copies.glob("[0-9]*/RESUME.json")]
        return any(r["links"] == [{"path": "ckpts/last.ckpt", "target": "ckpts/epoch=1-step=8.ckpt"}]
                   for r in recs)

    wait_for(durable, timeout=120, interval=0.2)
    hb = json.loads((p.shared / "heartbeats" / "h1.h1").read_text())
    os.killpg(hb["pgid"], signal.SIGTERM)  # RunPod: SIGTERM, then SIGKILL 5 s later
    time.sleep(5)  # the provider's grace, not a wait for a condition
    with contextlib.suppress(ProcessLookupError):
        os.killpg(hb["pgid"], signal.SIGKILL)
    wait_for(lambda: not live("h1", "h1"), timeout=30)
    shutil.rmtree(p.root / ".ablate" / "local" / "h1" / "ckpt" / "c1")
    (p.root / "faults" / "c1.hold").unlink()

    cli.json(p, "remediate", "--launch")
    wait_for(lambda: (p.shared / "final_ckpts" / "c1" / "MANIFEST.json").exists(), timeout=180, interval=0.3)
    manifest = json.loads((p.shared / "final_ckpts" / "c1" / "MANIFEST.json").read_text())
    ckpt = p.root / ".ablate" / "local" / manifest["host"] / "ckpt" / "c1"
    [start] = _trace(ckpt)
    assert start["resumed"] is True and start["first_epoch"] == 2, start
    assert os.readlink(ckpt / "ckpts" / "last.ckpt") == "epoch=4-step=20.ckpt"  # Lightning went on
    assert json.loads((ckpt / "metrics.json").read_text())["epochs"] == 5
    assert cli.json(p, "reconcile", "--fs")["complete"] is True
