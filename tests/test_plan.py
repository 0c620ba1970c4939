"""`ablate plan`: the contract shape, the cost/speed-aware split, queue files, the overwrite rule."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.errors import AblateError, ConfigError, QueueError
from ablate.plan.balance import balance, lower_bound
from ablate.plan.planner import plan
from ablate.sweep import cells
from tests.helpers.project import LocalProject


def _cfgs(p: LocalProject, rel_dir: str, names: list[str]) -> None:
    for n in names:
        p.cfg(f"{rel_dir}/{n}.yaml")


def _refused(p: LocalProject, exc: type[AblateError] = AblateError, **kw: object) -> str:
    before = p.snapshot()
    with pytest.raises(exc) as ei:
        plan(load_project(p.root), **kw)  # type: ignore[arg-type]
    assert ei.value.exit_code == 2
    assert p.snapshot() == before, "a refused plan must write nothing"
    return ei.value.message


# --------------------------------------------------------------------------- contract shape


def test_to_json_is_the_contract_shape(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "configs/recon", ["a", "b", "c"])
    _cfgs(p, "configs/det", ["d", "e"])
    p.write_config(cells=[{"glob": "configs/recon/*.yaml", "task": "recon"},
                          {"glob": "configs/det/*.yaml", "task": "det", "epochs": 4}],
                   hosts={"h1": {"speed": 1.0}, "h2": {"speed": 0.5, "gpus": [0, 1]}})
    out = plan(load_project(p.root)).to_json()
    assert json.loads(json.dumps(out)) == out
    assert set(out) == {"queues", "makespan", "lower_bound", "eta_seconds", "model"}
    assert out["eta_seconds"] is None and out["model"]["source"] == "declared"  # no history
    assert [q["queue"] for q in out["queues"]] == ["h1", "h2-g0", "h2-g1"]
    speeds = {"h1": 1.0, "h2": 0.5}
    for q in out["queues"]:
        assert set(q) == {"queue", "host", "slot", "cells", "cost", "finish", "eta_seconds", "priorities"}
        assert isinstance(q["cells"], list) and all(isinstance(c, str) for c in q["cells"])
        assert q["finish"] == pytest.approx(q["cost"] / speeds[q["host"]])
    assert [q["slot"] for q in out["queues"]] == [None, 0, 1]
    assert sorted(c for q in out["queues"] for c in q["cells"]) == ["a", "b", "c", "d", "e"]
    # recon: 3 epochs x 1.0 each; det: 4 epochs (the glob's) x 2.5 each
    assert sum(q["cost"] for q in out["queues"]) == pytest.approx(3 * 3.0 + 2 * 10.0)
    assert out["makespan"] == pytest.approx(max(q["finish"] for q in out["queues"]))
    assert out["lower_bound"] == pytest.approx(max(29.0 / 2.0, 10.0 / 1.0))


def test_queue_files_have_the_header_and_one_line_per_cell(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "configs/x", ["a", "b", "c", "d"])
    p.write_config(cells=[{"glob": "configs/x/*.yaml", "task": "recon"}],
                   hosts={"h1": {"speed": 1.0}, "g": {"speed": 1.0, "gpus": [2, 5]}, "one": {"gpus": [3]}})
    res = plan(load_project(p.root))
    names = sorted(f.name for f in (p.root / "queues").glob("*.txt"))
    assert names == ["g-g2.txt", "g-g5.txt", "h1.txt", "one.txt"]
    text = (p.root / "queues" / "g-g5.txt").read_text()
    assert text.splitlines()[0] == "# ablate: host=g slot=5"
    assert (p.root / "queues" / "h1.txt").read_text().splitlines()[0] == "# ablate: host=h1"
    assert (p.root / "queues" / "one.txt").read_text().splitlines()[0] == "# ablate: host=one slot=3"
    project = load_project(p.root)
    for q in res.queues:
        qf = cells.read_queue(project, q.queue)
        assert (qf.host, qf.slot) == (q.machine.host, q.machine.slot)
        assert [ln.cell for ln in qf.cells] == list(q.cells)
        assert all(ln.text == f"{c.cfg} recon 3" for ln, c in zip(qf.cells, q.cells, strict=True))
    assert sorted(cells.load_roster(project).names) == ["a", "b", "c", "d"]


def test_lines_show_a_row_per_queue_and_the_ratio(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b", "c"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    res = plan(load_project(p.root))
    text = "\n".join(res.lines())
    assert any(line.startswith("h1 ") for line in res.lines())
    assert any(line.startswith("h2 ") for line in res.lines())
    assert "lower bound" in text and "ratio" in text
    dry = plan(load_project(p.root), write=False)
    assert "dry run: nothing written" in dry.lines()


# --------------------------------------------------------------------------- the split


def test_cost_split_beats_count_split_on_a_bimodal_mix(local_project: LocalProject) -> None:
    p = local_project
    # The expensive cells sort first: a count split in name order would give one host all of them.
    _cfgs(p, "big", [f"a{i}" for i in range(8)])
    _cfgs(p, "small", [f"z{i}" for i in range(8)])
    p.write_config(tasks={"cheap": {"epochs": 1, "cost_per_epoch": 1.0},
                          "heavy": {"epochs": 1, "cost_per_epoch": 10.0}},
                   cells=[{"glob": "big/*.yaml", "task": "heavy"}, {"glob": "small/*.yaml", "task": "cheap"}],
                   hosts={"h1": {"speed": 1.0}, "h2": {"speed": 1.0}})
    res = plan(load_project(p.root), write=False)
    count_split_makespan = 8 * 10.0  # first half of the names = all eight heavy cells
    assert res.makespan == pytest.approx(44.0) == pytest.approx(res.lower_bound)
    assert res.makespan < count_split_makespan
    for q in res.queues:
        assert sum(c.task == "heavy" for c in q.cells) == 4


def test_speeds_are_respected(local_project: LocalProject) -> None:
    p = local_project  # h1 speed 1.0, h2 speed 0.5
    _cfgs(p, "c", [f"c{i:02d}" for i in range(12)])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    res = plan(load_project(p.root), write=False)
    by = {q.queue: q for q in res.queues}
    assert len(by["h1"].cells) == 8 and len(by["h2"].cells) == 4
    assert by["h1"].finish == pytest.approx(by["h2"].finish) == pytest.approx(24.0)
    assert res.makespan == pytest.approx(res.lower_bound)


def test_gpu_slots_give_one_queue_per_slot_at_the_hosts_speed(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", [f"c{i}" for i in range(9)])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}],
                   hosts={"big": {"speed": 2.0, "gpus": [0, 1]}, "one": {"speed": 1.0}})
    res = plan(load_project(p.root), write=False)
    assert [(q.queue, q.machine.slot, q.machine.speed) for q in res.queues] == [
        ("big-g0", 0, 2.0), ("big-g1", 1, 2.0), ("one", None, 1.0)]
    # nine cells of cost 3 over speeds 2, 2, 1: the best is 6 (three cells on "one" would be 9)
    assert res.makespan == pytest.approx(6.0)
    assert len(res.queues[2].cells) <= 2


def test_slots_key_gives_slots_from_zero(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b", "c"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}], hosts={"h": {"slots": 3}})
    res = plan(load_project(p.root), write=False)
    assert [q.queue for q in res.queues] == ["h-g0", "h-g1", "h-g2"]
    assert all(len(q.cells) == 1 for q in res.queues)


@pytest.mark.parametrize("seed", range(40))
def test_makespan_never_below_the_lower_bound_and_close_to_it(seed: int) -> None:
    rng = random.Random(seed)
    n, m = rng.randint(1, 120), rng.randint(1, 12)
    costs = [rng.choice([1.0, 2.5, 20.0]) * rng.uniform(0.5, 1.5) for _ in range(n)]
    speeds = [rng.choice([0.5, 0.7, 1.0, 1.3]) for _ in range(m)]
    assign = balance(costs, speeds)
    assert len(assign) == n and all(0 <= a < m for a in assign)
    load = [0.0] * m
    for i, j in enumerate(assign):
        load[j] += costs[i]
    makespan = max(load[j] / speeds[j] for j in range(m))
    lb = lower_bound(costs, speeds)
    assert makespan >= lb - 1e-9
    # LPT on uniform machines is within 2x; with the local search it is far closer in practice.
    assert makespan <= 2 * lb + 1e-9


def test_simple_cases_reach_the_bound() -> None:
    costs, speeds = [3.0, 3.0, 2.0, 2.0, 2.0], [1.0, 1.0]  # LPT alone gives 7; optimum is 6
    assign = balance(costs, speeds)
    loads = [sum(c for c, a in zip(costs, assign, strict=True) if a == j) for j in range(2)]
    assert max(loads) == pytest.approx(6.0) == pytest.approx(lower_bound(costs, speeds))


def test_plan_is_deterministic_whatever_the_file_creation_order(tmp_path: Path) -> None:
    outs: list[tuple[dict[str, Any], dict[str, str]]] = []
    for order in (range(30), reversed(range(30))):
        root = tmp_path / f"p{len(outs)}"
        root.mkdir()
        p = LocalProject(root)
        for i in order:
            p.cfg(f"configs/{'det' if i % 3 == 0 else 'recon'}/c{i:02d}.yaml")
        p.write_config(cells=[{"glob": "configs/recon/*.yaml", "task": "recon"},
                              {"glob": "configs/det/**/*.yaml", "task": "det"}],
                       hosts={"h1": {"speed": 1.0}, "h2": {"speed": 0.7, "gpus": [0, 1]},
                              "h3": {"speed": 1.3}})
        outs.append((plan(load_project(root)).to_json(), {f.name: f.read_text()
                                                          for f in sorted((root / "queues").glob("*.txt"))}))
    assert outs[0] == outs[1]


def test_double_star_crosses_directories(local_project: LocalProject) -> None:
    p = local_project
    p.cfg("configs/a/x1.yaml")
    p.cfg("configs/a/deep/er/x2.yaml")
    p.cfg("configs/x3.yaml")
    p.cfg("configs/a/other.json")
    p.write_config(cells=[{"glob": "configs/**/x*.yaml", "task": "recon"}])
    res = plan(load_project(p.root), write=False)
    assert sorted(c.cfg for q in res.queues for c in q.cells) == [
        "configs/a/deep/er/x2.yaml", "configs/a/x1.yaml", "configs/x3.yaml"]


def test_globs_skip_dot_files_and_ablate_yaml_like_a_shell(local_project: LocalProject) -> None:
    p = local_project
    p.cfg("c/a.yaml")
    p.cfg("c/.hidden.yaml")
    p.cfg(".ablate/shared/x.yaml")
    p.cfg(".git/y.yaml")
    p.write_config(cells=[{"glob": "**/*.yaml", "task": "recon"}])
    res = plan(load_project(p.root), write=False)
    assert [c.cfg for q in res.queues for c in q.cells] == ["c/a.yaml"]
    p.write_config(cells=[{"glob": "c/.*.yaml", "task": "recon"}])  # names the dot: matched, refused
    assert "'.hidden'" in _refused(p)


def test_same_file_from_two_globs_with_same_task_is_one_cell(local_project: LocalProject) -> None:
    p = local_project
    p.cfg("c/a.yaml")
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}, {"glob": "c/a.yaml", "task": "recon"}])
    res = plan(load_project(p.root), write=False)
    assert [c.name for q in res.queues for c in q.cells] == ["a"]


def test_a_thousand_cells_on_fifty_machines_completes(local_project: LocalProject) -> None:
    p = local_project
    for i in range(1000):
        path = p.root / "configs" / ("det" if i % 4 == 0 else "recon") / f"c{i:04d}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("lr: 0.1\n")
    hosts = {f"h{i:02d}": {"speed": [0.7, 1.0, 1.3][i % 3], "gpus": [0, 1]} for i in range(25)}
    p.write_config(cells=[{"glob": "configs/recon/*.yaml", "task": "recon"},
                          {"glob": "configs/det/*.yaml", "task": "det"}], hosts=hosts)
    res = plan(load_project(p.root))
    assert len(res.queues) == 50
    assert sum(len(q.cells) for q in res.queues) == 1000
    assert res.lower_bound <= res.makespan <= res.lower_bound * 1.05


# --------------------------------------------------------------------------- re-plan and refusals


def test_identical_replan_is_a_no_op(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b", "c"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    plan(load_project(p.root))
    stat = {f: f.stat().st_mtime_ns for f in (p.root / "queues").glob("*.txt")}
    # launched too: an identical plan never needs to touch it
    ledger = Path(load_project(p.root).layout().ledger("h1"))
    ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger.write_text("{}\n")
    logged: list[str] = []
    res = plan(load_project(p.root), log=logged.append)
    assert {c.action for c in res.changes} == {"unchanged"}
    assert logged == []
    assert {f: f.stat().st_mtime_ns for f in (p.root / "queues").glob("*.txt")} == stat


def test_unlaunched_plan_written_files_are_replanned(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    plan(load_project(p.root))
    _cfgs(p, "c", ["c", "d", "e"])
    res = plan(load_project(p.root))
    assert sorted(cells.load_roster(load_project(p.root)).names) == ["a", "b", "c", "d", "e"]
    assert "write" in {c.action for c in res.changes}


def test_refuses_to_rewrite_a_launched_queue(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    plan(load_project(p.root))
    ledger = Path(load_project(p.root).layout().ledger("h1"))
    ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger.write_text('{"lines": 2}\n')
    _cfgs(p, "c", ["c", "d", "e", "f"])
    msg = _refused(p)
    assert "launched" in msg and "h1" in msg and "ablate append" in msg


def test_refuses_a_new_queue_whose_name_was_launched(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    ledger = Path(load_project(p.root).layout().ledger("h2"))
    ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger.write_text("{}\n")
    assert "h2" in _refused(p)


def test_refuses_to_overwrite_a_hand_written_queue_file(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    p.queue("h1", ["c/a.yaml recon"])
    msg = _refused(p)
    assert "queues/h1.txt" in msg and "not written by plan" in msg


def test_refuses_to_drop_a_cell_added_by_hand_to_a_planned_file(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b"])
    p.cfg("extra/x.yaml")
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    plan(load_project(p.root))
    path = p.root / "queues" / "h1.txt"
    with path.open("a") as f:
        f.write("extra/x.yaml det\n")
    _cfgs(p, "c", ["c"])
    msg = _refused(p)
    assert "queues/h1.txt:" in msg and "'x'" in msg and "lose it" in msg


def test_hosts_subset_removes_stale_planned_files(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b", "c"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    plan(load_project(p.root))
    assert (p.root / "queues" / "h2.txt").exists()
    res = plan(load_project(p.root), hosts=["h1"])
    assert [q.queue for q in res.queues] == ["h1"]
    assert not (p.root / "queues" / "h2.txt").exists()
    assert sorted(cells.load_roster(load_project(p.root)).names) == ["a", "b", "c"]


def test_hosts_unknown_or_empty_is_refused(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    msg = _refused(p, ConfigError, hosts=["h1", "hh2"])
    assert "'hh2'" in msg and "did you mean 'h2'" in msg
    _refused(p, ConfigError, hosts=[])


def test_glob_matching_nothing_names_it(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}, {"glob": "nope/*.yml", "task": "det"}])
    msg = _refused(p, ConfigError)
    assert "cells[1]" in msg and "nope/*.yml" in msg and "matches no file" in msg


def test_glob_name_collision_names_both(local_project: LocalProject) -> None:
    p = local_project
    p.cfg("a/x.yaml")
    p.cfg("b/x.yaml")
    p.write_config(cells=[{"glob": "a/*.yaml", "task": "recon"}, {"glob": "b/*.yaml", "task": "recon"}])
    msg = _refused(p, ConfigError)
    assert "a/x.yaml" in msg and "b/x.yaml" in msg and "'x'" in msg


def test_collision_with_a_kept_hand_written_queue_names_both(local_project: LocalProject) -> None:
    p = local_project
    p.cfg("a/x.yaml")
    p.cfg("b/x.yaml")
    p.write_config(cells=[{"glob": "a/*.yaml", "task": "recon"}])
    p.queue("mine", ["b/x.yaml recon"])
    msg = _refused(p, QueueError)
    assert "queues/mine.txt:1" in msg and "a/x.yaml" in msg and "b/x.yaml" in msg


def test_hand_written_queue_with_other_name_is_kept_in_glob_mode(local_project: LocalProject) -> None:
    p = local_project
    p.cfg("a/x.yaml")
    p.cfg("b/y.yaml")
    p.write_config(cells=[{"glob": "a/*.yaml", "task": "recon"}])
    mine = p.queue("mine", ["b/y.yaml det"])
    res = plan(load_project(p.root))
    assert mine.read_text() == "b/y.yaml det\n"
    assert ("keep", mine) in {(c.action, c.path) for c in res.changes}
    assert sorted(cells.load_roster(load_project(p.root)).names) == ["x", "y"]


@pytest.mark.parametrize("bad", ["c/a b.yaml", "c/$(x).yaml", "c/a;b.yaml", "c/x'y.yaml"])
def test_glob_matching_an_unsafe_file_name_is_refused(local_project: LocalProject, bad: str) -> None:
    p = local_project
    p.cfg("c/ok.yaml")
    p.cfg(bad)
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    msg = _refused(p)
    assert bad in msg or repr(bad.rsplit("/", 1)[1].rsplit(".", 1)[0]) in msg


def test_rebalance_existing_queues_when_no_cells_globs(local_project: LocalProject) -> None:
    p = local_project
    names = [f"k{i}" for i in range(6)]
    _cfgs(p, "c", names)
    mine = p.queue("all", [f"c/{n}.yaml recon" for n in names])
    res = plan(load_project(p.root))
    aside = mine.with_name("all.txt.replaced")
    assert not mine.exists() and aside.read_text() == "".join(f"c/{n}.yaml recon\n" for n in names)
    assert [q.queue for q in res.queues] == ["h1", "h2"]
    assert sorted(cells.load_roster(load_project(p.root)).names) == names
    # re-planning the plan-written files again is a no-op
    again = plan(load_project(p.root))
    assert {c.action for c in again.changes} == {"unchanged"}


def test_rebalance_sets_aside_a_hand_written_file_named_like_a_planned_queue(
        local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b", "c"])
    mine = p.queue("h1", ["# my notes", "c/a.yaml recon", "c/b.yaml recon", "c/c.yaml det"])
    original = mine.read_bytes()
    plan(load_project(p.root))
    assert (p.root / "queues" / "h1.txt.replaced").read_bytes() == original
    assert mine.read_text().startswith("# ablate: host=h1\n")
    assert sorted(cells.load_roster(load_project(p.root)).names) == ["a", "b", "c"]


def test_rebalance_refuses_when_the_set_aside_name_exists(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a"])
    p.queue("all", ["c/a.yaml recon"])
    (p.root / "queues" / "all.txt.replaced").write_text("older\n")
    assert "all.txt.replaced" in _refused(p)


def test_rebalance_with_nothing_to_plan_is_refused(local_project: LocalProject) -> None:
    assert "nothing to plan" in _refused(local_project, ConfigError)


def test_a_bad_existing_queue_file_is_refused(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    p.queue("mine", ["c/a.yaml nosuchtask"])
    assert "queues/mine.txt:1" in _refused(p, QueueError)


def test_dry_run_writes_nothing(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b"])
    p.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}])
    before = p.snapshot()
    res = plan(load_project(p.root), write=False)
    assert p.snapshot() == before
    assert {c.action for c in res.changes} == {"write"} and not res.written


def test_unreachable_shared_fs_allows_a_first_plan_but_not_a_rewrite(local_project: LocalProject) -> None:
    p = local_project
    _cfgs(p, "c", ["a", "b"])
    # `.invalid` never resolves (RFC 6761): the ssh transport fails at once, as with hosts not up yet.
    p.write_config(profile="bare", workdir="/srv/proj", cells=[{"glob": "c/*.yaml", "task": "recon"}],
                   hosts={"h1": {"ssh": "h1.invalid"}, "h2": {"ssh": "h2.invalid"}})
    notes: list[str] = []
    plan(load_project(p.root), log=notes.append)
    assert any("not reachable" in n for n in notes)
    assert (p.root / "queues" / "h1.txt").is_file()
    _cfgs(p, "c", ["c"])
    msg = _refused(p)
    assert "cannot check" in msg and "launched" in msg
