"""Fabricate result dirs exactly as `run_one` publishes them (docs/ARCHITECTURE.md): the checkpoint,
the metrics JSON, `<name>.log` and a MANIFEST.json recording each artifact's size and sha256.

The files are real: torch / safetensors / numpy checkpoints written by those libraries.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from pathlib import Path
from typing import Any

from tests.helpers.project import LocalProject


def write_checkpoint(path: Path, seed: int = 0) -> None:
    """A real checkpoint in the format its extension names."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    w = (np.arange(16, dtype=np.float32) + seed).reshape(4, 4)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors.numpy import save_file

        save_file({"w": w, "epoch": np.array([seed], dtype=np.int64)}, str(path))
    elif suffix in (".pt", ".pth", ".ckpt", ".bin"):
        import torch

        torch.save({"w": torch.from_numpy(w), "epoch": seed}, str(path))
    elif suffix == ".npy":
        np.save(path, w)
    elif suffix == ".npz":
        np.savez(path, w=w, b=w[0])
    else:
        path.write_bytes(bytes(range(256)) * (seed + 1))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _entry(cell_dir: Path, rel: str) -> dict[str, Any]:
    path = cell_dir / rel
    return {"file": rel, "size": path.stat().st_size, "sha256": sha256(path)}


def make_result(
    parent: Path,
    cfg: str,
    task: str,
    epochs: int,
    *,
    project_dir: Path | None = None,
    checkpoint: str = "model.safetensors",
    metrics: str | None = "metrics.json",
    metrics_data: Any = None,
    log_text: str = "epoch 1 val_loss=0.5\n",
    seed: int = 0,
    host: str = "h1",
    queue: str = "q1",
    name: str | None = None,
    manifest_overrides: dict[str, Any] | None = None,
) -> Path:
    """Write `<parent>/<name>/` as run_one would, `name` = the cfg's basename without extension.

    cfg_sha256 is the sha256 of `<project_dir>/<cfg>` when that file exists (as run_one hashes the
    cfg in its workdir), else null.
    """
    base = posixpath.basename(cfg)
    name = name or (base.rsplit(".", 1)[0] if "." in base else base)
    d = parent / name
    d.mkdir(parents=True, exist_ok=True)
    # run_one keeps each artifact's path relative to {ckpt_dir}.
    write_checkpoint(d / checkpoint, seed)
    artifacts = {"checkpoint": _entry(d, checkpoint)}
    if metrics:
        data = {"val_loss": 0.25 + seed, "train_loss": 0.2} if metrics_data is None else metrics_data
        (d / metrics).parent.mkdir(parents=True, exist_ok=True)
        (d / metrics).write_text(json.dumps(data))
        artifacts["metrics"] = _entry(d, metrics)
    (d / f"{name}.log").write_text(log_text)
    artifacts["log"] = _entry(d, f"{name}.log")
    cfg_file = project_dir / cfg if project_dir else None
    manifest: dict[str, Any] = {
        "name": name, "cfg": cfg, "task": task, "epochs": epochs,
        "cat": posixpath.basename(posixpath.dirname(cfg)) or "default",
        "cfg_sha256": sha256(cfg_file) if cfg_file and cfg_file.is_file() else None,
        "wrapper_version": "0123456789ab", "run_queue_version": "ba9876543210",
        "spec_version": "abcdefabcdef", "host": host, "queue": queue, "commit": None,
        "started": 1700000000.1, "ended": 1700000100.2, "resume": 0,
        "artifacts": artifacts,
    }
    manifest.update(manifest_overrides or {})
    (d / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return d


def rewrite_manifest(cell_dir: Path) -> None:
    """Re-record every artifact's size and sha256 (to test load failures the hash cannot see)."""
    mpath = cell_dir / "MANIFEST.json"
    manifest = json.loads(mpath.read_text())
    for entry in manifest["artifacts"].values():
        entry.update(_entry(cell_dir, entry["file"]))
    mpath.write_text(json.dumps(manifest, indent=1))


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def publish_cells(project: LocalProject, cells: list[tuple[str, str, int]]) -> LocalProject:
    """Configs, their durable results on the shared FS and one queue `q1` listing them."""
    for i, (cfg, task, epochs) in enumerate(cells):
        project.cfg(cfg, seed=i)
        make_result(project.shared / "final_ckpts", cfg, task, epochs, project_dir=project.root, seed=i)
    project.queue("q1", [f"{cfg} {task}" for cfg, task, _ in cells])
    return project
