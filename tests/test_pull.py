"""ablate.results.pull: copy final_ckpts/ from the shared FS, checksummed and resumable."""

from __future__ import annotations

from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.results.pull import pull
from ablate.results.reconcile import reconcile
from tests.helpers.project import LocalProject
from tests.helpers.results import make_result, publish_cells, truncate

CELLS = [("configs/recon/a.yaml", "recon", 3), ("configs/recon/b.yaml", "recon", 3)]


@pytest.fixture
def proj(local_project: LocalProject) -> LocalProject:
    published: LocalProject = publish_cells(local_project, CELLS)
    return published


def local(p: LocalProject) -> Path:
    return p.root / "results" / "t1"


def tree(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def test_pull_copies_every_result_and_reconcile_then_passes(proj: LocalProject) -> None:
    final = proj.shared / "final_ckpts"
    (final / ".staging.a.h2.99").mkdir()
    (final / ".staging.a.h2.99" / "model.safetensors").write_bytes(b"in flight")
    project = load_project(proj.root)
    result = pull(project)
    assert result.copied == 8 and result.skipped == 0 and result.cells == 2 and result.ok
    assert result.bytes == sum(len(b) for b in tree(final / "a").values()) + sum(
        len(b) for b in tree(final / "b").values())
    assert result.to == str(local(proj))
    assert tree(local(proj)) == {k: v for k, v in tree(final).items() if not k.startswith(".staging")}
    assert not list(local(proj).rglob("*.part"))
    assert set(result.to_json()) >= {"copied", "skipped", "bytes", "cells", "to"}
    assert result.lines()[-1].startswith(f"pulled 2 result dirs to {local(proj)}: 8 files copied")
    assert reconcile(project).complete


def test_second_pull_copies_nothing_and_a_damaged_local_file_is_fetched_again(proj: LocalProject) -> None:
    project = load_project(proj.root)
    pull(project)
    again = pull(project)
    assert (again.copied, again.skipped, again.bytes) == (0, 8, 0)

    ckpt = local(proj) / "a" / "model.safetensors"
    good = ckpt.read_bytes()
    ckpt.write_bytes(bytes(len(good)))  # same size, other bytes
    truncate(local(proj) / "b" / "metrics.json")
    third = pull(project)
    assert (third.copied, third.skipped) == (2, 6)
    assert ckpt.read_bytes() == good
    assert reconcile(project).complete


def test_damaged_fs_copy_is_never_placed(proj: LocalProject) -> None:
    project = load_project(proj.root)
    pull(project)
    truncate(proj.shared / "final_ckpts" / "b" / "model.safetensors")  # a silent short copy on the FS
    ckpt = local(proj) / "b" / "model.safetensors"
    ckpt.write_bytes(b"local damage")  # so pull must fetch it again
    (local(proj) / "a" / "a.log").unlink()
    result = pull(project)
    assert not result.ok and result.copied == 1  # a's log; b's checkpoint refused
    assert result.failed == [{"name": "b", "file": "model.safetensors", "error": result.failed[0]["error"]}]
    assert "damaged" in result.failed[0]["error"]
    assert ckpt.read_bytes() == b"local damage"  # left as it was, no short copy in its place
    assert not list(local(proj).rglob("*.part"))
    assert any(line.startswith("failed: b: model.safetensors") for line in result.lines())
    assert not reconcile(project).complete


def test_to_dir_missing_and_unexpected(proj: LocalProject, tmp_path: Path) -> None:
    proj.cfg("configs/recon/c.yaml")
    with (proj.root / "queues" / "q1.txt").open("a") as f:
        f.write("configs/recon/c.yaml recon\n")
    make_result(proj.shared / "final_ckpts", "configs/old/zz.yaml", "recon", 3)
    result = pull(load_project(proj.root), to=tmp_path / "out")
    assert result.to == str(tmp_path / "out")
    assert result.missing == ["c"] and result.unexpected == ["zz"] and result.cells == 3
    assert (tmp_path / "out" / "zz" / "MANIFEST.json").is_file()
    assert "not on the shared FS yet: c" in result.lines()


def test_artifact_in_a_sub_dir_is_pulled_to_the_same_place(local_project: LocalProject) -> None:
    local_project.write_config(artifacts={"checkpoint": "ckpt/model.safetensors", "metrics": "metrics.json",
                                          "metrics_keys": ["val_loss"]})
    cfg = local_project.cfg("configs/a.yaml")
    make_result(local_project.shared / "final_ckpts", cfg, "recon", 3, project_dir=local_project.root,
                checkpoint="ckpt/model.safetensors")
    local_project.queue("q1", [f"{cfg} recon"])
    project = load_project(local_project.root)
    assert pull(project).copied == 4
    assert (local(local_project) / "a" / "ckpt" / "model.safetensors").is_file()
    assert reconcile(project).complete
