"""`ablate init`: a working local example, templates for the ssh profiles, never an overwrite."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.config.scaffold import init
from ablate.errors import AblateError
from ablate.plan.planner import plan
from ablate.sweep import cells

REPO = Path(__file__).resolve().parent.parent


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_local_scaffold_loads_plans_and_trains(tmp_path: Path) -> None:
    created = init(tmp_path, "local")
    assert tmp_path / "ablate.yaml" in created and (tmp_path / "queues").is_dir()
    assert all(p.exists() for p in created)
    text = (tmp_path / "ablate.yaml").read_text()
    assert text.count("#") > 10, "the scaffold is commented"
    project = load_project(tmp_path)
    assert project.profile.name == "local" and project.cells
    res = plan(project)
    assert sum(len(q.cells) for q in res.queues) == 4
    assert res.makespan == pytest.approx(res.lower_bound)
    roster = cells.load_roster(load_project(tmp_path))
    # the train command really trains one cell as rendered
    cell = roster.cells[roster.names[0]]
    out = tmp_path / "ckpt"
    cmd = project.train.format(cfg=cell.cfg, epochs=1, ckpt_dir=out, resume=0)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run(shlex.split(cmd), cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)
    assert (out / project.artifacts.checkpoint[0]).stat().st_size > 0
    assert (out / "metrics.json").is_file()


@pytest.mark.parametrize("profile", ["autodl", "runpod", "vast", "bare"])
def test_ssh_profile_scaffold_is_a_template_that_loads(tmp_path: Path, profile: str) -> None:
    init(tmp_path, profile)
    text = (tmp_path / "ablate.yaml").read_text()
    assert f"profile: {profile}" in text and "CHANGE-ME" in text
    project = load_project(tmp_path)
    assert project.profile.name == profile and project.workdir.startswith("/")
    assert all(h.transport == "ssh" for h in project.hosts.values())
    assert not (tmp_path / "configs").exists(), "no example configs for ssh profiles"


def test_refuses_when_ablate_yaml_exists(tmp_path: Path) -> None:
    (tmp_path / "ablate.yaml").write_text("mine: 1\n")
    before = _files(tmp_path)
    with pytest.raises(AblateError) as ei:
        init(tmp_path, "local")
    assert ei.value.exit_code == 2 and "ablate.yaml" in ei.value.message
    assert _files(tmp_path) == before


def test_refuses_when_an_example_config_exists_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "configs" / "ablate-example" / "baseline.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("mine\n")
    before = _files(tmp_path)
    with pytest.raises(AblateError) as ei:
        init(tmp_path, "local")
    assert "baseline.yaml" in ei.value.message
    assert _files(tmp_path) == before and not (tmp_path / "ablate.yaml").exists()


def test_unknown_profile_lists_the_shipped_ones(tmp_path: Path) -> None:
    with pytest.raises(AblateError) as ei:
        init(tmp_path, "aws")
    assert ei.value.exit_code == 2
    for name in ("autodl", "bare", "local", "runpod", "vast"):
        assert name in ei.value.message
    assert list(tmp_path.iterdir()) == []


def test_existing_queues_dir_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "queues").mkdir()
    (tmp_path / "queues" / "mine.txt").write_text("a.yaml recon\n")
    created = init(tmp_path, "autodl")
    assert created == [tmp_path / "ablate.yaml"]
    assert sorted(p.name for p in (tmp_path / "queues").iterdir()) == ["mine.txt"]


def test_repo_profile_can_be_scaffolded(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "lab.yaml").write_text("shared_fs: /nfs/x\nckpt_root: /scratch/ckpt\n")
    init(tmp_path, "lab")
    assert load_project(tmp_path).profile.shared_fs == "/nfs/x"
