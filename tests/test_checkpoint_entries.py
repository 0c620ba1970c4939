"""Checkpoints as frameworks write them (`artifacts.checkpoint` a glob, a directory, a list;
`artifacts.pick`), through the real wrappers: a trainer writes its files with the real libraries
(transformers' sharded `save_pretrained`, safetensors, torch), run_one resolves and publishes them,
MANIFEST.json records each file, `reconcile --fs` loads every one, `pull` copies them, and a damaged
or missing shard is caught."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.remote.checkpoints import verify
from ablate.remote.checkpoints.artifacts import sha256_file
from ablate.run.launch import launch
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject, drained
from tests.helpers.results import make_result, sha256, truncate
from tests.helpers.tmux import require_tmux

# The trainer, by its path: importing it would import torch into every process that collects this
# module, whichever tests it runs.
FRAMEWORK_TRAIN = Path(__file__).resolve().parent / "helpers" / "framework_train.py"


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def sweep(lp: LocalProject, style: str, checkpoint: object, pick: str | None = None) -> Path:
    """One cell trained in `style`, run through launch/run_one; its published result dir."""
    train = (f"{sys.executable} {FRAMEWORK_TRAIN} --style {style} --config {{cfg}} "
             "--epochs {epochs} --out {ckpt_dir}")
    artifacts: dict[str, Any] = {"checkpoint": checkpoint, "metrics": "metrics.json",
                                 "metrics_keys": ["val_loss"]}
    if pick is not None:
        artifacts["pick"] = pick
    lp.write_config(train=train, artifacts=artifacts)
    lp.queue("q1", [lp.cfg(f"cfgs/a/{style}.yaml") + " recon 3"])
    launch(load_project(lp.root), "q1", "h1")
    drained(lp, "h1", "q1")
    return lp.shared / "final_ckpts" / style


def recorded(final: Path) -> list[str]:
    """The checkpoint files MANIFEST.json records, each checked against the file beside it."""
    entries = json.loads((final / "MANIFEST.json").read_text())["artifacts"]["checkpoint"]
    assert isinstance(entries, list)
    for e in entries:
        f = final / e["file"]
        assert f.stat().st_size == e["size"] and sha256_file(f) == e["sha256"]
    return [e["file"] for e in entries]


@pytest.mark.tmux
def test_hf_sharded_checkpoint_verified_pulled_and_a_damaged_shard_caught(
        local_project: LocalProject, cli: Cli) -> None:
    lp = local_project
    final = sweep(lp, "hf", ["hf/model*.safetensors*", "hf/config.json"])
    files = recorded(final)
    shards = [f for f in files if f.startswith("hf/model-") and f.endswith(".safetensors")]
    assert len(shards) >= 4 and all(f"-of-{len(shards):05d}" in s for s in shards)
    assert sorted(files) == sorted([*shards, "hf/model.safetensors.index.json", "hf/config.json"])
    index = json.loads((final / "hf/model.safetensors.index.json").read_text())
    assert {f"hf/{s}" for s in index["weight_map"].values()} == set(shards)

    rec = cli.json(lp, "reconcile", "--fs")
    assert rec["complete"] and rec["verified"] == 1
    assert cli.json(lp, "pull")["cells"] == 1
    pulled = lp.root / "results" / "t1" / "hf"
    assert all(sha256_file(pulled / f) == sha256_file(final / f) for f in files)
    assert cli.json(lp, "reconcile")["verified"] == 1  # the pulled copy, loaded here

    truncate(final / shards[1])  # a shard cut short on the FS
    rec = cli.json(lp, "reconcile", "--fs", code=1)
    assert [(c["name"], c["file"]) for c in rec["corrupt"]] == [("hf", shards[1])]

    # A shard the index names, not in the result (its manifest entry gone with it): missing.
    (final / shards[1]).unlink()
    m = json.loads((final / "MANIFEST.json").read_text())
    m["artifacts"]["checkpoint"] = [e for e in m["artifacts"]["checkpoint"] if e["file"] != shards[1]]
    (final / "MANIFEST.json").write_text(json.dumps(m))
    rec = cli.json(lp, "reconcile", "--fs", code=1)
    problems = rec["missing"] + rec["corrupt"]
    assert [p.get("file") for p in problems] == [shards[1]]
    assert "names shard" in json.dumps(problems)


@pytest.mark.tmux
@pytest.mark.parametrize(("style", "checkpoint", "pick", "want"), [
    ("lightning", "epoch=*.ckpt", "newest", ["epoch=2-step=30.ckpt"]),
    ("deepspeed", ["global_step*", "latest"], "newest",
     ["global_step30/mp_rank_00_model_states.pt", "global_step30/zero_pp_rank_0_mp_rank_00_optim_states.pt",
      "latest"]),
    ("peft", ["adapter_model.safetensors", "adapter_config.json"], None,
     ["adapter_model.safetensors", "adapter_config.json"]),
    ("lightning", "epoch=*.ckpt", None, ["epoch=0-step=10.ckpt", "epoch=1-step=20.ckpt",
                                         "epoch=2-step=30.ckpt"]),
])
def test_framework_layouts_publish_exactly_the_files_named(
        local_project: LocalProject, cli: Cli, style: str, checkpoint: object, pick: str | None,
        want: list[str]) -> None:
    final = sweep(local_project, style, checkpoint, pick)
    assert recorded(final) == want
    rec = cli.json(local_project, "reconcile", "--fs")
    assert rec["complete"] and rec["verified"] == 1


@pytest.mark.tmux
def test_a_glob_that_matches_nothing_is_a_sync_failure_naming_it(local_project: LocalProject,
                                                                cli: Cli) -> None:
    lp = local_project
    final = sweep(lp, "peft", ["adapter_model.safetensors", "adapter_*.bin"])
    assert not final.exists()
    states = cli.json(lp, "status")["cells"]
    assert states["peft"]["state"] == "sync_failed"
    assert "adapter_*.bin matches nothing" in states["peft"]["reason"]


def _dir_result(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A result dir whose checkpoint is `files` (recorded as a list, as run_one records a directory)."""
    d = make_result(tmp_path, "c/r.yaml", "recon", 1)
    (d / "model.safetensors").unlink()
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    m = json.loads((d / "MANIFEST.json").read_text())
    m["artifacts"]["checkpoint"] = [{"file": rel, "size": len(data), "sha256": sha256(d / rel)}
                                    for rel, data in files.items()]
    (d / "MANIFEST.json").write_text(json.dumps(m))
    return d


def test_a_directory_may_hold_empty_files_a_named_file_may_not(tmp_path: Path) -> None:
    art = {"checkpoint": ["ckpt"], "metrics": "metrics.json", "metrics_keys": ["val_loss"]}
    d = _dir_result(tmp_path / "a", {"ckpt/weights.bin": b"\x01" * 64, "ckpt/.done": b""})
    assert verify.verify_cell_dir(str(d), art) == []
    art = {**art, "checkpoint": ["ckpt/weights.bin", "ckpt/.done"]}
    assert [(p["file"], p["kind"]) for p in verify.verify_cell_dir(str(d), art)] == [
        ("ckpt/.done", "zero_byte")]


def test_a_recorded_file_no_entry_names_and_an_entry_nothing_recorded_are_corrupt(
        tmp_path: Path) -> None:
    d = _dir_result(tmp_path, {"ckpt/weights.bin": b"\x01" * 64, "extra.bin": b"\x02" * 8})
    art = {"checkpoint": ["ckpt", "tokenizer.json"], "metrics": "metrics.json", "metrics_keys": []}
    got = {p["file"]: p["error"] for p in verify.verify_cell_dir(str(d), art)}
    assert set(got) == {"tokenizer.json", "extra.bin"}
    assert "ablate.yaml expects tokenizer.json" in got["tokenizer.json"]
    assert "none of ablate.yaml's entries" in got["extra.bin"]
