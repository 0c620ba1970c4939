"""The checkpoint dirs the frameworks really write verify, and damage in each is caught without
running anything from the files.

The files are written by the real libraries (tests/helpers/framework_ckpts.py, in a subprocess),
once per installation of them (kept across runs in the user's cache dir): transformers.Trainer's
`checkpoint-N/` and a sharded save_pretrained, lightning with save_hyperparameters() of an
argparse.Namespace, accelerate's save_state, torch.distributed.checkpoint (one process), PEFT's LoRA
adapter, DeepSpeed's save_checkpoint (ZeRO 1 on the CPU; when deepspeed is not installed, its
documented layout written with torch.save: OUT/deepspeed/WRITTEN_BY says which) and a legacy
(non-zip) torch.save. Every damage is done *before* MANIFEST.json is written, so the
sha256 matches the damaged bytes and only the structure can tell.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ablate.remote.checkpoints import verify
from tests.helpers.framework_ckpts import flip_tensor_byte, publish, rewrite_record
from tests.helpers.shared import install_key, once_per_install, once_per_run

REPO = Path(__file__).resolve().parent.parent
# (source dir under the generated tree, the checkpoint entry it is published under)
DIRS = {"trainer": ("trainer", "trainer"), "sharded": ("sharded", "hf"), "lightning": ("lightning", "ckpts"),
        "accelerate": ("accelerate", "state"), "dcp": ("dcp", "dcp"), "peft": ("peft", "adapter"),
        "deepspeed": ("deepspeed", "ds"), "legacy": ("legacy", "legacy")}
CKPT = "trainer/checkpoint-2"


# The tests that read the generated tree run in one xdist worker (`--dist loadgroup`), with the
# other tests that import torch (tests/test_verify_by_load.py: its import costs each process seconds of
# CPU): the tree is written there, and no other worker waits for it. Under any other
# distribution, the first worker to ask writes it and the others wait on its lock
# (tests/helpers/shared.py).
pytestmark = pytest.mark.xdist_group("torch")


def _write(out: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "tests.helpers.framework_ckpts", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


# What the tree is made by: the libraries that write it (and those they write with), and the
# writer's code. Another version of any, or a changed writer, and the tree is written anew.
WRITERS = ("torch", "transformers", "lightning", "accelerate", "peft", "deepspeed", "safetensors", "numpy",
           "huggingface-hub")


@pytest.fixture(scope="session")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree the real libraries wrote, once per installation of them (kept across runs and
    clones in the user's cache dir: tests/helpers/shared.py), copied once per test run (every
    xdist worker reads the same copy): read-only here, a test damages only the copy `cell`
    publishes under its own tmp_path."""
    key = install_key(WRITERS, [REPO / "tests" / "helpers" / "framework_ckpts.py"])
    return once_per_run(tmp_path_factory, "frameworks",
                        lambda out: once_per_install("frameworks", key, _write, out))


def cell(written: Path, tmp_path: Path, which: str,
         damage: Callable[[Path], Any] | None = None, verify_modes: dict[str, str] | None = None,
         ) -> tuple[list[dict[str, str]], dict[str, str]]:
    src, entry = DIRS[which]
    d = publish(tmp_path, which, written / src, entry, damage)
    art: dict[str, Any] = {"checkpoint": entry, "metrics": "metrics.json", "metrics_keys": ["val_loss"]}
    if verify_modes is not None:
        art["verify"] = verify_modes
    return verify.check_cell_dir(str(d), art)


def test_every_framework_dir_verifies_and_says_how(written: Path, tmp_path: Path) -> None:
    hows = {}
    for which in DIRS:
        problems, checks = cell(written, tmp_path, which)
        assert problems == [], (which, problems)
        hows.update(checks)
    # weights_only takes these: loaded (rng_state.pth with the numpy globals transformers allows)
    for f in (f"{CKPT}/optimizer.pt", f"{CKPT}/scheduler.pt", f"{CKPT}/rng_state.pth",
              f"{CKPT}/model.safetensors", "state/optimizer.bin", "state/random_states_0.pkl",
              "ds/global_step1/mp_rank_00_model_states.pt", "legacy/model.pt"):
        assert hows[f] == "loaded", f
    # pickled classes (TrainingArguments, argparse.Namespace, DeepSpeed's, DCP's): structure, never run
    for f in (f"{CKPT}/training_args.bin", "ckpts/epoch=0-step=2.ckpt", "dcp/.metadata", "dcp/__0_0.distcp"):
        assert hows[f] == "structure", f
    ds_optim = "ds/global_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt"
    by_deepspeed = (written / "deepspeed" / "WRITTEN_BY").read_text().startswith("deepspeed")
    assert hows[ds_optim] == ("structure" if by_deepspeed else "loaded")
    assert hows["ds/latest"] == "hash"


@pytest.mark.parametrize(("which", "rel"), [
    ("trainer", f"{CKPT}/optimizer.pt"), ("trainer", f"{CKPT}/rng_state.pth"),
    ("lightning", "ckpts/epoch=0-step=2.ckpt"), ("accelerate", "state/optimizer.bin"),
    ("deepspeed", "ds/global_step1/mp_rank_00_model_states.pt"),
    ("deepspeed", "ds/global_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt"),
])
def test_a_flipped_byte_inside_a_tensor_is_a_crc_mismatch(written: Path, tmp_path: Path, which: str,
                                                         rel: str) -> None:
    """torch.load takes these bytes (it checks no CRC); the zip record's CRC32 does not."""
    names: list[str] = []
    problems, _ = cell(written, tmp_path, which, lambda d: names.append(flip_tensor_byte(d / rel)))
    assert problems == [{"file": rel, "kind": "corrupt",
                         "error": f"zip record {names[0]} CRC32 mismatch (damaged)"}]


def test_a_flipped_byte_inside_a_dcp_item_is_a_crc_mismatch(written: Path, tmp_path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    items = FileSystemReader(str(written / "dcp")).read_metadata().storage_data.values()
    biggest = max(items, key=lambda i: i.length)

    def damage(d: Path) -> None:
        flip_tensor_byte(d / "dcp" / biggest.relative_path, biggest.offset, biggest.length)

    problems, _ = cell(written, tmp_path, "dcp", damage)
    assert problems == [{"file": f"dcp/{biggest.relative_path}", "kind": "corrupt",
                         "error": "zip record archive/data/0 CRC32 mismatch (damaged)"}]


def cut(rel: str, keep: float = 0.6) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        data = (d / rel).read_bytes()
        (d / rel).write_bytes(data[:int(len(data) * keep)])
    return damage


@pytest.mark.parametrize(("which", "rel", "error"), [
    ("trainer", f"{CKPT}/optimizer.pt", "zip central directory unreadable (truncated or damaged)"),
    ("trainer", f"{CKPT}/training_args.bin", "zip central directory unreadable (truncated or damaged)"),
    ("legacy", "legacy/model.pt", "storage "),
    ("dcp", "dcp/.metadata", "pickle ends before STOP (truncated)"),
])
def test_a_truncated_file_is_corrupt(written: Path, tmp_path: Path, which: str, rel: str, error: str) -> None:
    problems, _ = cell(written, tmp_path, which, cut(rel))
    assert [(p["file"], p["kind"]) for p in problems if p["file"] == rel] == [(rel, "corrupt")]
    assert next(p for p in problems if p["file"] == rel)["error"].startswith(error), problems
    # a .distcp's items are found through its .metadata: cut, it says so too
    assert {p["file"] for p in problems} == ({rel, "dcp/__0_0.distcp"} if which == "dcp" else {rel})


def test_a_truncated_distcp_is_short_of_what_its_metadata_needs(written: Path, tmp_path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    items = FileSystemReader(str(written / "dcp")).read_metadata().storage_data.values()
    need = max(i.offset + i.length for i in items if i.relative_path == "__0_0.distcp")
    size = int((written / "dcp" / "__0_0.distcp").stat().st_size * 0.95)
    problems, _ = cell(written, tmp_path, "dcp", cut("dcp/__0_0.distcp", 0.95))
    assert {"file": "dcp/__0_0.distcp", "kind": "corrupt",
            "error": f"{size} bytes, dcp/.metadata needs {need} (truncated)"} in problems
    own = [p for p in problems if "metadata needs" not in p["error"]]
    assert [(p["file"], p["kind"]) for p in own] == [("dcp/__0_0.distcp", "corrupt")], problems
    assert own[0]["error"].startswith("zip central directory of the archive at "), own


@pytest.mark.parametrize(("which", "rel", "missing"), [
    ("dcp", "dcp/__0_0.distcp", "dcp/.metadata names __0_0.distcp, which is not in the result"),
    ("deepspeed", "ds/global_step1/mp_rank_00_model_states.pt",
     "ds/latest names global_step1, which has no mp_rank_*_model_states.pt"),
    ("deepspeed", "ds/global_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt",
     "DeepSpeed ZeRO shard of rank 0 is not in the result (dp_world_size 1)"),
    ("sharded", "hf/model-00002-of-00003.safetensors",
     "index hf/model.safetensors.index.json names shard hf/model-00002-of-00003.safetensors, which is "
     "not in the result"),
    ("peft", "adapter/adapter_model.safetensors",
     "adapter/adapter_config.json has no adapter weights beside it (adapter_model.safetensors or .bin)"),
    ("trainer", f"{CKPT}/model.safetensors",
     f"{CKPT}/trainer_state.json has no model weights beside it (model.safetensors, "
     "model.safetensors.index.json, pytorch_model.bin, ...)"),
])
def test_a_file_the_framework_needs_is_missing(written: Path, tmp_path: Path, which: str, rel: str,
                                               missing: str) -> None:
    problems, _ = cell(written, tmp_path, which, lambda d: (d / rel).unlink())
    assert {"file": rel, "kind": "missing", "error": missing} in problems, problems


def test_deepspeed_latest_naming_a_tag_not_in_the_result(written: Path, tmp_path: Path) -> None:
    problems, _ = cell(written, tmp_path, "deepspeed",
                       lambda d: (d / "ds" / "latest").write_text("global_step9"))
    assert problems == [{"file": "ds/global_step9/", "kind": "missing",
                         "error": "ds/latest names global_step9, which is not in the result"}]


def test_a_torch_pickle_cut_before_stop_inside_a_sound_archive(written: Path, tmp_path: Path) -> None:
    """The zip is whole (every CRC right) but its data.pkl ends early: the pickle tells."""
    rel = f"{CKPT}/training_args.bin"
    problems, _ = cell(written, tmp_path, "trainer",
                       lambda d: rewrite_record(d / rel, "/data.pkl", lambda b: b[:len(b) // 2]))
    assert problems == [{"file": rel, "kind": "corrupt",
                         "error": "training_args/data.pkl: pickle ends before STOP (truncated)"}]


def test_a_storage_shorter_than_its_tensors_need(written: Path, tmp_path: Path) -> None:
    rel = f"{CKPT}/optimizer.pt"
    got: list[str] = []

    def damage(d: Path) -> None:
        got.append(rewrite_record(d / rel, "/data/0", lambda b: b[:len(b) // 2]))

    problems, _ = cell(written, tmp_path, "trainer", damage)
    assert len(problems) == 1 and problems[0]["file"] == rel, problems
    assert got == ["optimizer/data/0"]
    error = problems[0]["error"]  # storage 0 is the step count: one float32
    assert error == "storage 0 needs 4 bytes, record has 2"


def test_a_plain_pickle_cut_before_stop_and_one_whole(tmp_path: Path) -> None:
    from tests.helpers.results import make_result, rewrite_manifest

    d = make_result(tmp_path, "a.yaml", "t", 1, checkpoint="state.pkl")
    (d / "state.pkl").write_bytes(pickle.dumps({"epoch": 3, "best": [0.5, 0.25]}))
    rewrite_manifest(d)
    art = {"checkpoint": "state.pkl", "metrics": "metrics.json", "metrics_keys": ["val_loss"]}
    assert verify.check_cell_dir(str(d), art) == ([], {"state.pkl": "structure", "metrics.json": "loaded",
                                                        "a.log": "hash"})
    (d / "state.pkl").write_bytes(pickle.dumps({"epoch": 3, "best": [0.5, 0.25]})[:-3])
    rewrite_manifest(d)
    assert verify.verify_cell_dir(str(d), art) == [
        {"file": "state.pkl", "kind": "corrupt", "error": "pickle ends before STOP (truncated)"}]


class Boom:
    """Unpickling it would write the marker file: the proof that nothing ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (Path(self.marker), "ran"))


@pytest.mark.parametrize("fmt", ["torch", "pickle"])
def test_nothing_in_a_pickle_ever_runs(tmp_path: Path, fmt: str) -> None:
    import torch

    from tests.helpers.results import make_result, rewrite_manifest

    marker = tmp_path / "ran"
    ckpt = "best.pt" if fmt == "torch" else "best.pkl"
    d = make_result(tmp_path, "a.yaml", "t", 1, checkpoint=ckpt)
    obj = {"w": torch.ones(3), "payload": Boom(str(marker))}
    if fmt == "torch":
        torch.save(obj, d / ckpt)
    else:
        (d / ckpt).write_bytes(pickle.dumps({"payload": Boom(str(marker))}))
    rewrite_manifest(d)
    art = {"checkpoint": ckpt, "metrics": "metrics.json"}
    assert verify.check_cell_dir(str(d), art)[1][ckpt] == "structure"
    loaded = verify.verify_cell_dir(str(d), {**art, "verify": {ckpt: "load"}})
    assert [p["kind"] for p in loaded] == ["corrupt"] and "`verify: structure`" in loaded[0]["error"]
    assert not marker.exists()
    if fmt == "pickle":  # the payload is live: the real unpickler runs it
        pickle.loads((d / ckpt).read_bytes())
        assert marker.read_text() == "ran"


def test_modes_per_entry(written: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hash: size and sha256 only; structure: no library at all (torch cannot even be imported);
    load: every file must load with its library."""
    _, hashed = cell(written, tmp_path / "h", "trainer", verify_modes={"trainer": "hash"})
    assert {v for k, v in hashed.items() if k.startswith("trainer/")} == {"hash"}
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    problems, structured = cell(written, tmp_path / "s", "trainer", verify_modes={"trainer": "structure"})
    assert problems == []
    assert {v for k, v in structured.items() if k.startswith("trainer/")} == {"structure"}
    monkeypatch.undo()
    problems, _ = cell(written, tmp_path / "l", "trainer", verify_modes={"trainer": "load"})
    assert [(p["file"], p["kind"]) for p in problems] == [(f"{CKPT}/training_args.bin", "corrupt")]
    assert "refuses its globals (accelerate.state.PartialState, " in problems[0]["error"]


def test_structure_mode_catches_a_truncated_safetensors_by_its_header(written: Path, tmp_path: Path) -> None:
    rel = "adapter/adapter_model.safetensors"
    problems, _ = cell(written, tmp_path, "peft", cut(rel, 0.9), verify_modes={"adapter": "structure"})
    assert [(p["file"], p["kind"]) for p in problems] == [(rel, "corrupt")]
    assert problems[0]["error"].startswith("safetensors data is ") and "(truncated or damaged)" in \
        problems[0]["error"]


def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_the_crc_pass_is_the_sha256_read(tmp_path: Path) -> None:
    """A hashed torch archive is read once: the bytes read while verifying it are its size (plus
    the small files and headers), not twice that."""
    import torch

    from tests.helpers.results import make_result, rewrite_manifest

    d = make_result(tmp_path, "a.yaml", "t", 1, checkpoint="big.pt")
    torch.save({"w": torch.randn(6_000_000)}, d / "big.pt")  # 24 MB: the threaded pass
    rewrite_manifest(d)
    size = (d / "big.pt").stat().st_size
    art = {"checkpoint": "big.pt", "metrics": "metrics.json", "verify": {"big.pt": "structure"}}
    verify.check_cell_dir(str(d), art)  # imports and caches settled
    before = rchar()
    problems, checks = verify.check_cell_dir(str(d), art)
    read = rchar() - before
    assert problems == [] and checks["big.pt"] == "structure"
    assert size <= read < size * 1.05, (read, size)


def test_verify_tree_reports_structure_in_checks(written: Path, tmp_path: Path) -> None:
    publish(tmp_path, "lightning", written / "lightning", "ckpts")
    out = verify.verify_tree({"dir": str(tmp_path), "artifacts": {"checkpoint": "ckpts/*.ckpt",
                                                                  "metrics": "metrics.json"}, "workers": 2})
    assert out["cells"]["lightning"]["problems"] == []
    assert out["cells"]["lightning"]["checks"]["ckpts/epoch=0-step=2.ckpt"] == "structure"


def test_inert_unpickler_keeps_plain_values_and_stubs_objects() -> None:
    from ablate.remote.checkpoints import pickles

    data = pickle.dumps({"args": Boom("/nonexistent/x"), "n": [1, 2]}, protocol=2)
    scan = pickles.scan(io.BytesIO(data))
    assert scan.error is None and scan.root["n"] == [1, 2]
    assert ("pathlib", "Path") in scan.globals or ("pathlib", "PosixPath") in scan.globals
    assert isinstance(scan.root["args"], pickles.Stub)
