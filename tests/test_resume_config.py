"""`resume:` in ablate.yaml (ablate/config/entries.py): what a cell resumes from, as
`artifacts.checkpoint` names entries; the run spec carries it to the instances; `{run_id}` and
`{attempt}` are train template fields."""

from __future__ import annotations

from ablate.config.entries import Resume
from ablate.config.project import load_project
from ablate.run.placement import render_spec
from tests.helpers.project import LocalProject, refused


def test_absent_resume_is_the_checkpoint_entries_newest_of_each_glob(local_project: LocalProject) -> None:
    local_project.write_config()
    p = load_project(local_project.root)
    assert p.resume == Resume(("model.safetensors",), "newest")
    spec = render_spec(p, p.hosts["h1"], "/x/run_one.sh").decode()
    assert "ABLATE_RESUME=model.safetensors\n" in spec and "ABLATE_RESUME_PICK=newest\n" in spec


def test_resume_entries_a_mapping_or_false(local_project: LocalProject) -> None:
    lp = local_project
    lp.write_config(resume=["checkpoint-*", "extra/state.pt"])
    assert load_project(lp.root).resume == Resume(("checkpoint-*", "extra/state.pt"), "newest")
    lp.write_config(resume={"checkpoint": "ckpts/*last*.ckpt", "pick": "all"})
    assert load_project(lp.root).resume == Resume(("ckpts/*last*.ckpt",), "all")
    lp.write_config(resume=False)
    p = load_project(lp.root)
    assert p.resume is None
    assert "ABLATE_RESUME=-\n" in render_spec(p, p.hosts["h1"], "/x/run_one.sh").decode()


def test_bad_resume_is_refused_with_the_fix(local_project: LocalProject) -> None:
    lp = local_project
    lp.write_config(resume="../elsewhere/ckpt")
    refused(lp, "resume", "relative path inside {ckpt_dir}")
    lp.write_config(resume=True)
    refused(lp, "resume", "true is the default", "or false")
    lp.write_config(resume={"checkpoint": "last.ckpt", "pick": "latest"})
    refused(lp, "resume.pick", "newest")
    lp.write_config(resume={"checkpoint": "last.ckpt", "every": 5})
    refused(lp, "resume", "every")


def test_run_id_and_attempt_are_template_fields(local_project: LocalProject) -> None:
    lp = local_project
    lp.write_config(train=lp.config()["train"] + " --run-id {run_id} --attempt {attempt}")
    assert "{run_id}" in load_project(lp.root).train
    lp.write_config(train=lp.config()["train"] + " --run {run}")
    refused(lp, "train", "{run}")
