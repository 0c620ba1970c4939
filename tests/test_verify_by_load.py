"""ablate.remote.checkpoints.verify:
every artifact is loaded by its type and checked against MANIFEST.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ablate.remote.checkpoints import verify
from tests.helpers.results import make_result, rewrite_manifest, truncate

REPO = Path(__file__).resolve().parent.parent
ART = {"checkpoint": "model.safetensors", "metrics": "metrics.json", "metrics_keys": ["val_loss"]}
# Torch checkpoints are written and read here: these tests share the xdist worker of the other
# tests that import torch (`--dist loadgroup`; tests/test_verify_frameworks.py), whose import
# costs each process that does it seconds of CPU.
pytestmark = pytest.mark.xdist_group("torch")


def art(checkpoint: str) -> dict[str, object]:
    return {**ART, "checkpoint": checkpoint}


def kinds(problems: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(p["file"], p["kind"]) for p in problems]


@pytest.mark.parametrize("ckpt", ["model.safetensors", "best.pth", "last.pt", "m.ckpt", "pytorch_model.bin",
                                  "w.npy", "w.npz", "weights.h5", "sub/best.pth"])
def test_good_result_of_every_format_verifies(tmp_path: Path, ckpt: str) -> None:
    d = make_result(tmp_path, "cfgs/a.yaml", "recon", 3, checkpoint=ckpt)
    assert verify.verify_cell_dir(str(d), art(ckpt)) == []


@pytest.mark.parametrize(("ckpt", "how"), [("model.safetensors", "loaded"), ("best.pth", "loaded"),
                                         ("w.npy", "loaded"), ("weights.h5", "hash")])
def test_each_file_says_how_it_was_checked(tmp_path: Path, ckpt: str, how: str) -> None:
    d = make_result(tmp_path, "cfgs/a.yaml", "recon", 3, checkpoint=ckpt)
    problems, checks = verify.check_cell_dir(str(d), art(ckpt))
    assert problems == []
    assert checks == {ckpt: how, "metrics.json": "loaded", "a.log": "hash"}
    assert verify.check_cell_dir(str(d), art(ckpt), load=False)[1][ckpt] == "hash"
    assert verify.check_cell_dir(str(d), art(ckpt), load=False, check_hash=False)[1][ckpt] == "size"


def test_truncated_checkpoint_is_corrupt_by_manifest_size(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3)
    truncate(d / "model.safetensors", 0.9)
    problems = verify.verify_cell_dir(str(d), ART)
    assert kinds(problems) == [("model.safetensors", "corrupt")]
    assert "MANIFEST.json says" in problems[0]["error"] and "truncated" in problems[0]["error"]


def test_truncated_torch_file_is_corrupt_even_when_the_manifest_agrees(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3, checkpoint="best.pth")
    truncate(d / "best.pth")
    rewrite_manifest(d)  # hash checks pass now: only its structure tells
    problems = verify.verify_cell_dir(str(d), art("best.pth"))
    assert kinds(problems) == [("best.pth", "corrupt")]
    assert problems[0]["error"].startswith("zip central directory unreadable (truncated or damaged)")
    assert verify.verify_cell_dir(str(d), art("best.pth"), load=False) == []


def test_zero_byte_checkpoint_is_reported_as_such(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3)
    (d / "model.safetensors").write_bytes(b"")
    assert kinds(verify.verify_cell_dir(str(d), ART)) == [("model.safetensors", "zero_byte")]


def test_empty_log_is_fine_when_the_manifest_says_so(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3, log_text="")
    assert verify.verify_cell_dir(str(d), ART) == []


def test_missing_files_and_missing_dir(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3)
    (d / "model.safetensors").unlink()
    (d / "a.log").unlink()
    assert kinds(verify.verify_cell_dir(str(d), ART)) == [("model.safetensors", "missing"),
                                                          ("a.log", "missing")]
    assert kinds(verify.verify_cell_dir(str(tmp_path / "nope"), ART)) == [("", "missing")]
    (d / "MANIFEST.json").unlink()
    assert ("MANIFEST.json", "missing") in kinds(verify.verify_cell_dir(str(d), ART))


def test_metrics_missing_a_key_is_corrupt(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3, metrics_data={"train_loss": 1.0})
    problems = verify.verify_cell_dir(str(d), ART)
    assert kinds(problems) == [("metrics.json", "corrupt")]
    assert "val_loss" in problems[0]["error"]


def test_metrics_that_are_not_an_object_or_not_json(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3, metrics_data=[1, 2])
    assert "JSON object" in verify.verify_cell_dir(str(d), ART)[0]["error"]
    (d / "metrics.json").write_text("{not json")
    rewrite_manifest(d)
    assert "not valid JSON" in verify.verify_cell_dir(str(d), ART)[0]["error"]


def test_garbage_pth_is_corrupt_with_the_load_error(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3, checkpoint="best.pth")
    (d / "best.pth").write_bytes(b"this is not a checkpoint\n" * 40)
    rewrite_manifest(d)
    problems = verify.verify_cell_dir(str(d), art("best.pth"))
    assert problems == [{"file": "best.pth", "kind": "corrupt",
                         "error": "not a torch checkpoint: neither a zip archive nor a pickle"}]


class Arbitrary:
    def __init__(self) -> None:
        self.payload = "would run code on unpickling"


def test_torch_file_pickling_arbitrary_objects_is_checked_by_structure_and_refused_under_load(
        tmp_path: Path) -> None:
    """Absent `verify`, a pickle weights_only refuses is checked by structure (never run); under
    `verify: load` it is corrupt, and the reason names the global and the way out."""
    import torch

    d = make_result(tmp_path, "a.yaml", "recon", 3, checkpoint="best.pth")
    torch.save({"w": torch.ones(2), "obj": Arbitrary()}, d / "best.pth")
    rewrite_manifest(d)
    assert verify.check_cell_dir(str(d), art("best.pth"))[1]["best.pth"] == "structure"
    problems = verify.verify_cell_dir(str(d), {**art("best.pth"), "verify": {"best.pth": "load"}})
    assert kinds(problems) == [("best.pth", "corrupt")]
    error = problems[0]["error"]
    assert "weights_only" in error and "test_verify_by_load.Arbitrary" in error
    assert "`verify: structure`" in error
    assert "\x1b" not in error and "\n" not in error


def test_numpy_object_array_is_refused_without_pickle(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3, checkpoint="w.npy")
    np.save(d / "w.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    rewrite_manifest(d)
    assert kinds(verify.verify_cell_dir(str(d), art("w.npy"))) == [("w.npy", "corrupt")]


def test_same_size_other_bytes_is_a_hash_mismatch(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3, checkpoint="w.npy")
    other = tmp_path / "other.npy"
    np.save(other, np.ones((4, 4), dtype=np.float32))
    (d / "w.npy").write_bytes(other.read_bytes())  # same shape, same size, still loads
    problems = verify.verify_cell_dir(str(d), art("w.npy"))
    assert kinds(problems) == [("w.npy", "corrupt")] and "sha256" in problems[0]["error"]
    assert verify.verify_cell_dir(str(d), art("w.npy"), load=False, check_hash=False) == []


def test_manifest_for_another_cell_or_another_checkpoint_name(tmp_path: Path) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3, manifest_overrides={"name": "b"})
    assert "for cell 'b'" in verify.verify_cell_dir(str(d), ART)[0]["error"]
    d2 = make_result(tmp_path, "c.yaml", "recon", 3)
    problems = verify.verify_cell_dir(str(d2), art("best.pth"))
    assert "ablate.yaml expects best.pth" in problems[0]["error"]


def test_missing_loader_library_is_a_clear_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make_result(tmp_path, "a.yaml", "recon", 3, checkpoint="best.pth")
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    problems = verify.verify_cell_dir(str(d), art("best.pth"))
    assert problems == [{"file": "best.pth", "kind": "no_loader",
                         "error": "torch not installed: pip install 'ablate[torch]'"}]


def test_import_is_stdlib_only() -> None:
    code = ("import sys, ablate.remote.checkpoints.verify, ablate.remote.host.probe; "
            "bad = [m for m in ('torch', 'numpy', 'safetensors', 'yaml', 'click') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_verify_tree_in_parallel_processes_matches_serial(tmp_path: Path) -> None:
    for i in range(5):
        make_result(tmp_path, f"c{i}.yaml", "recon", 3, seed=i)
    truncate(tmp_path / "c3" / "model.safetensors")
    (tmp_path / ".staging.c9.h1.42").mkdir()
    args = {"dir": str(tmp_path), "artifacts": ART, "names": None}
    parallel = verify.verify_tree({**args, "workers": 2})
    serial = verify.verify_tree({**args, "workers": 1})
    assert parallel == serial
    json.dumps(parallel)
    assert parallel["dirs"] == [f"c{i}" for i in range(5)]
    assert ".staging.c9.h1.42" in parallel["entries"]
    bad = {n for n, c in parallel["cells"].items() if c["problems"]}
    assert bad == {"c3"}
    c0 = parallel["cells"]["c0"]
    assert set(c0["files"]) == {"model.safetensors", "metrics.json", "c0.log", "MANIFEST.json"}
    assert c0["manifest"]["cfg"] == "c0.yaml"


def test_verify_tree_only_verifies_named_dirs(tmp_path: Path) -> None:
    make_result(tmp_path, "a.yaml", "recon", 3)
    make_result(tmp_path, "b.yaml", "recon", 3)
    out = verify.verify_tree({"dir": str(tmp_path), "artifacts": ART, "names": ["a"]})
    assert out["cells"]["a"]["problems"] == [] and out["cells"]["b"]["problems"] is None
    assert out["cells"]["b"]["manifest_sha256"]
    missing = verify.verify_tree({"dir": str(tmp_path / "none"), "artifacts": ART})
    assert missing["exists"] is False and missing["cells"] == {}


def test_verify_local_script(tmp_path: Path) -> None:
    make_result(tmp_path, "a.yaml", "recon", 3)
    make_result(tmp_path, "b.yaml", "recon", 3, metrics_data={"loss": 1})
    script = [sys.executable, str(REPO / "scripts" / "verify_local.py")]
    flags = ["--checkpoint", "model.safetensors", "--metrics", "metrics.json", "--keys", "val_loss"]
    p = subprocess.run([*script, str(tmp_path), *flags], capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert "b: metrics.json: corrupt:" in p.stdout and "1/2 result dirs verified" in p.stdout
    p = subprocess.run([*script, str(tmp_path / "a"), *flags, "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"dir": str(tmp_path / "a"), "checked": 1, "verified": 1, "problems": {}}


def test_bfloat16_safetensors_verifies(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    d = make_result(tmp_path, "a.yaml", "recon", 3)
    save_file({"w": torch.ones(3, dtype=torch.bfloat16)}, str(d / "model.safetensors"))
    rewrite_manifest(d)
    assert verify.verify_cell_dir(str(d), ART) == []
    truncate(d / "model.safetensors", 0.8)
    rewrite_manifest(d)
    assert verify.verify_cell_dir(str(d), ART)[0]["error"].startswith("load failed: ")
