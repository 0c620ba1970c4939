"""The shared FS's part of the storage budget (ablate/run/refusals.py `shared_check`): the results
still to come and the resume copies of the cells running at once, each `budget.ckpt_size`; none
with `resume: false`, no disk to measure for a sweep kept in an object store."""

from __future__ import annotations

from pathlib import Path

from ablate.config.project import load_project
from ablate.run.host_measure import Section
from ablate.run.refusals import Cells, shared_check
from tests.helpers.project import LocalProject

GB = 10**9


def _df(free_kib: int) -> Section:
    """`dfat -k`'s answer: the path, then `df -P -k`."""
    return Section(0, f"/shared/ablate/t1\nFilesystem 1024-blocks Used Available Capacity Mounted on\n"
                      f"nfs:/export 999999999 1 {free_kib} 1% /shared\n")


def _project(tmp_path: Path, **overrides: object) -> LocalProject:
    lp = LocalProject(tmp_path / "proj")
    lp.root.mkdir()
    lp.write_config(budget={"ckpt_size": "1GB", "scratch": "1MB"}, **overrides)
    return lp


def test_results_to_come_and_three_copies_per_running_cell(tmp_path: Path) -> None:
    project = load_project(_project(tmp_path).root)
    host = project.host("h1")
    cells = Cells({"h1": 6, "h2": 4}, total=10, queues=2, published=4)
    need = (10 - 4 + 3 * 2) * GB  # 6 results to come, 6 copies
    ok = shared_check(project, host, cells, _df(need // 1024 + 1))
    assert ok.ok and ok.reason.startswith("need 12.0 GB (6 result(s) to come + 6 resume copies (3 per "
                                          "running cell, 2 queue(s)) x 1.0 GB), free "), ok
    short = shared_check(project, host, cells, _df(need // 1024 - 1))
    assert not short.ok and short.reason.startswith("below budget: need 12.0 GB"), short
    assert "on /shared (sweep root " in short.reason, short
    unknown = shared_check(project, host, cells, Section(1, "dfat: no such directory"))
    assert not unknown.ok and "cannot measure free space at" in unknown.reason, unknown


def test_no_copies_with_resume_off(tmp_path: Path) -> None:
    project = load_project(_project(tmp_path, resume=False).root)
    got = shared_check(project, project.host("h1"), Cells({}, total=3, queues=3), _df(3 * GB // 1024 + 1))
    assert got.ok and "(3 result(s) to come + 0 resume copies" in got.reason, got


def test_a_sweep_in_an_object_store_has_no_shared_disk(tmp_path: Path) -> None:
    lp = _project(tmp_path)
    (lp.root / "profiles").mkdir()
    (lp.root / "profiles" / "vast.yaml").write_text("storage: s3://bucket/p\nckpt_root: /root/ck\n")
    lp.write_config(budget={"ckpt_size": "1GB", "scratch": "1MB"}, profile="vast", workdir="/root/repo")
    project = load_project(lp.root)
    got = shared_check(project, project.host("h1"), Cells({}, total=3, queues=3), None)
    assert got.ok and "object store" in got.reason, got
