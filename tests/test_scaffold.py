"""`ablate init`: a working local example, templates for the ssh and Slurm profiles, never an
overwrite."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.config.scaffold import init, render
from ablate.errors import AblateError
from ablate.plan.planner import plan
from ablate.sweep import cells
from tests.helpers.cli import Cli

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
    assert "queues:" not in text and "Slurm" not in text


def test_slurm_profile_scaffold_is_one_host_of_n_batch_jobs(tmp_path: Path, cli: Cli) -> None:
    r = cli(tmp_path, "init", "--profile", "slurm")
    assert r.code == 0, r.err
    assert sorted(_files(tmp_path)) == ["ablate.yaml", "queues/.gitkeep"], "no example configs"
    text = (tmp_path / "ablate.yaml").read_text()
    assert "profile: slurm" in text and "CHANGE-ME" in text and text.count("#") > 10
    hosts = text[text.index("\nhosts:"):]
    assert "cluster: {queues: 4}" in hosts and "batch job" in hosts and "Slurm picks" in hosts
    assert "gpus: [" not in hosts and "slots:" not in hosts, "no GPU list on a Slurm host"
    project = load_project(tmp_path)
    host = project.hosts["cluster"]
    assert list(project.hosts) == ["cluster"] and host.transport == "slurm"
    assert host.slots == (0, 1, 2, 3) and not host.pins_gpus
    assert host.profile.slurm is not None and project.workdir.startswith("/")
    assert project.budget.ckpt_size > 0 and len(project.cells) == 2


def test_a_repo_profile_of_transport_slurm_gets_the_slurm_template(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "hpc.yaml").write_text(
        "transport: slurm\nshared_fs: /lustre/me\nckpt_root: /lustre/scratch/me\n"
        "slurm: {partition: a100, time: \"12:00:00\", gpus: 1}\n")
    init(tmp_path, "hpc")
    text = (tmp_path / "ablate.yaml").read_text()
    assert "profile: hpc" in text and "cluster: {queues: 4}" in text and "Profile hpc (Slurm)" in text
    project = load_project(tmp_path)
    assert project.hosts["cluster"].profile.slurm is not None
    assert project.hosts["cluster"].profile.slurm.partition == "a100"


def test_the_other_profiles_render_as_before() -> None:
    """The Slurm template changed nothing of the ssh one: its hosts block, workdir comment, note."""
    text = render("bare", "ssh")
    assert "workdir: /root/code/CHANGE-ME   # CHANGE-ME: the repo on the instances; cwd" in text
    assert ("hosts:                          # CHANGE-ME: key = ssh alias (from ~/.ssh/config) "
            "unless `ssh:` says otherwise\n  bare-1: {speed: 1.0}\n"
            "  bare-2: {speed: 1.3, gpus: [0, 1]}   # a faster box; one queue per GPU slot\n"
            "# Per-host disk budget") in text
    assert "  runpod-1: {speed: 1.0, instance_id: CHANGE-ME}\n" in render("runpod", "ssh")
    assert "# Profile lab: check its shared_fs and ckpt_root.\n" in render("lab", "ssh")


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
    for name in ("autodl", "bare", "local", "runpod", "slurm", "vast"):
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
