"""The cost model (declared, learned from history), ETAs in plan and status, estimates.tsv, GPU
slots end to end and the per-host disk budget: real files, real tmux, the real tiny trainer."""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import ablate.demo.train as demo_train
from ablate.config.project import load_project
from ablate.errors import CheckFailed
from ablate.plan import cost
from ablate.plan.cost import glob_match, learn, load_model, write_estimates
from ablate.plan.planner import plan
from ablate.remote.host.probe import snapshot
from ablate.remote.queue.learn import learn_rates, learned_text
from ablate.run.append import append
from ablate.run.launch import launch, launch_all
from ablate.run.stop import stop
from ablate.sweep.cells import Cell, read_queue
from ablate.sweep.snapshot import Snapshot
from ablate.transport.local import LocalFS
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject, events
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for


def wait_drained(lp: LocalProject, pairs: list[tuple[str, str]], since: dict[str, int] | None = None) -> None:
    since = since or {}

    def done() -> bool:
        return all(any(e["ev"] == "queue_end" for e in events(lp, h, q)[since.get(q, 0):]) for h, q in pairs)

    wait_for(done, timeout=60)


def estimates(lp: LocalProject) -> tuple[list[str], dict[tuple[str, str], int], dict[str, int]]:
    rows = (lp.shared / "estimates.tsv").read_text().splitlines()
    split = [r.split("\t") for r in rows]
    hosts = {(f[1], f[2]): int(f[3]) for f in split if f[0] == "host"}
    cells = {f[1]: int(f[2]) for f in split if f[0] == "cell"}
    assert all(r.startswith(("#", "host\t", "over\t", "cell\t", "cost\t")) for r in rows)
    # Each cell's task and declared units, for the runners' learning (ablate/remote/queue/learn.py).
    costs = {f[1]: (f[2], float(f[3])) for f in split if f[0] == "cost"}
    assert set(costs) == set(cells) and all(units > 0 for _, units in costs.values()), rows
    return rows[0].split(), hosts, cells


# --------------------------------------------------------------------------- declared


@pytest.mark.parametrize(("pattern", "path", "hit"), [
    ("configs/**/*.yaml", "configs/a.yaml", True),
    ("configs/**/*.yaml", "configs/x/y/z.yaml", True),
    ("configs/*.yaml", "configs/x/a.yaml", False),
    ("**/big_*.yaml", "big_1.yaml", True),
    ("**/big_*.yaml", "a/b/big_1.yaml", True),
    ("configs/det/*", "configs/det/a.yaml", True),
    ("configs/det/?.yaml", "configs/det/ab.yaml", False),
    ("configs/[ab].yaml", "configs/b.yaml", True),
    ("configs/[!ab].yaml", "configs/b.yaml", False),
    ("configs/**", "configs/x/y.yaml", True),
    ("configs/a.yaml", "./configs/a.yaml", True),
])
def test_override_globs_have_the_cells_glob_semantics(pattern: str, path: str, hit: bool) -> None:
    assert glob_match(pattern, path) is hit


def test_declared_cost_takes_the_first_matching_override(local_project: LocalProject) -> None:
    lp = local_project
    for rel in ("configs/recon/a.yaml", "configs/recon/deep/big_b.yaml", "configs/det/c.yaml",
                "configs/det/big_d.yaml"):
        lp.cfg(rel)
    lp.write_config(cells=[{"glob": "configs/recon/**/*.yaml", "task": "recon"},
                           {"glob": "configs/det/*.yaml", "task": "det", "epochs": 4}],
                    costs=[{"glob": "configs/**/big_*.yaml", "cost": 50},
                           {"glob": "configs/det/*.yaml", "cost_per_epoch": 7},
                           {"glob": "configs/**/*.yaml", "cost": 999}],  # never reached for these
                    hosts={"h1": {"speed": 1.0}})
    project = load_project(lp.root)
    res = plan(project, write=False)
    by = {c.name: c for q in res.queues for c in q.cells}
    assert {n: cost.declared_cost(project, c) for n, c in by.items()} == {
        "a": 999.0, "big_b": 50.0, "c": 28.0, "big_d": 50.0}
    # the first match wins, so big_d is 50 (not 7 x 4); the plan's cost is the sum of them
    assert res.to_json()["queues"][0]["cost"] == pytest.approx(999 + 50 + 28 + 50)
    # longest first inside the queue: its tail holds the small cells (what a runner steals)
    assert [c.name for c in res.queues[0].cells] == ["a", "big_d", "big_b", "c"]  # ties: cfg order
    no_override = Cell("other/x.yaml", "det", 2)
    assert cost.declared_cost(project, no_override) == pytest.approx(5.0)  # tasks: 2.5 per epoch


BAD_COSTS: list[tuple[object, str]] = [
    ({"glob": "c/*.yaml"}, "exactly one of cost"),
    ({"glob": "c/*.yaml", "cost": 1, "cost_per_epoch": 2}, "exactly one of cost"),
    ({"glob": "c/*.yaml", "cost": -1}, "must be > 0"),
    ({"glob": "c/*.yaml", "cost": "big"}, "finite number"),
    ({"glob": "/abs/*.yaml", "cost": 1}, "relative glob"),
    ({"glob": "c/a b.yaml", "cost": 1}, "relative glob"),
    ({"glob": "c/*.yaml", "cots": 1}, "did you mean 'cost'"),
    ({"cost": 1}, "glob: is required"),
]


@pytest.mark.parametrize(("entry", "needle"), BAD_COSTS, ids=[n for _, n in BAD_COSTS])
def test_bad_costs_entry_is_one_line_exit_2(local_project: LocalProject, cli: Cli,
                                            entry: object, needle: str) -> None:
    lp = local_project
    lp.cfg("c/a.yaml")
    lp.write_config(cells=[{"glob": "c/*.yaml", "task": "recon"}], costs=[entry])
    before = lp.snapshot()
    code, _, err = cli(lp, "plan")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "ablate.yaml" in lines[0] and "costs[0]" in lines[0] and needle in lines[0], err
    assert lp.snapshot() == before


def test_costs_that_is_not_a_list_is_refused(local_project: LocalProject,
                                             cli: Cli) -> None:
    local_project.write_config(costs={"glob": "c/*.yaml", "cost": 1})
    code, _, err = cli(local_project, "status")
    assert code == 2 and "costs: must be a list" in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- learned


def test_fit_recovers_known_values_from_noisy_runs() -> None:
    """The controller's fit is the runners' (`learn_rates`): mean durations, a stuck run left out."""
    rng = random.Random(7)
    spu = {"recon": 2.0, "det": 0.8, "seg": 5.0}
    speed = {"a": 1.0, "b": 0.5, "c": 1.3, "d": 1.0}
    obs = []
    for _ in range(400):
        task, host = rng.choice(sorted(spu)), rng.choice(sorted(speed))
        c = rng.choice([1.0, 3.0, 10.0, 25.0])
        obs.append((host, task, c, c * spu[task] / speed[host] * math.exp(rng.gauss(0, 0.2))))
    obs[0] = (*obs[0][:3], obs[0][3] * 30)  # a stuck run
    r = learn_rates(obs, {"a": 1.0, "b": 1.0, "c": 1.3, "d": 1.0})  # b is declared fast: learned slow
    assert r.outliers >= 1 and r.cells == 400 - r.outliers
    for h, s in speed.items():
        assert r.speed[h] == pytest.approx(s, rel=0.06), h
    for t, s in spu.items():  # the mean of lognormal noise: exp(sigma^2 / 2) above the median
        assert r.scale[t] == pytest.approx(s * math.exp(0.02), rel=0.06), t


def _synthetic_history(lp: LocalProject) -> dict[str, Any]:
    """Queue files and event files as runners write them, with durations from a known model:
    recon 2.0 s and det 0.8 s per cost unit; hosts a 1.0, b 0.5 (declared 1.0), d 1.5; c idle."""
    spu = {"recon": 2.0, "det": 0.8}
    true_speed = {"a": 1.0, "b": 0.5, "d": 1.5}
    lp.write_config(hosts={"a": {"speed": 1.0}, "b": {"speed": 1.0}, "c": {"speed": 0.8},
                           "d": {"speed": 1.5}})
    project = load_project(lp.root)
    per: dict[str, list[str]] = {"a": [], "b": [], "d": []}
    cells: dict[str, Cell] = {}
    for i in range(24):
        host = "abd"[i % 3]
        task = "recon" if i % 2 else "det"
        c = Cell(lp.cfg(f"cfgs/x/c{i:02d}.yaml"), task, 1 + i % 4)
        cells[c.name] = c
        per[host].append(c.line)
    for h, lines in per.items():
        lp.queue(f"q{h}", [f"# ablate: host={h}", *lines])
    t = 1_700_000_000.0
    evs: dict[str, list[dict[str, Any]]] = {h: [] for h in per}

    def ran(host: str, name: str, secs: float, rc: int = 0, resume: int = 0, **extra: Any) -> None:
        nonlocal t
        base = {"host": host, "queue": f"q{host}", "idx": 0, "cell": name, **extra}
        evs[host].append({"t": t, "ev": "start", "resume": resume, **base})
        t += secs
        evs[host].append({"t": t, "ev": "end", "rc": rc, "dur": secs, **base})

    def secs(name: str, host: str) -> float:
        c = cells[name]
        return cost.declared_cost(project, c) * spu[c.task] / true_speed[host]

    for h, lines in per.items():
        for line in lines:
            name = line.split()[0].rsplit("/", 1)[1][:-5]
            if name == "c00":  # stolen by d from qa: timed on d
                ran("d", name, secs(name, "d"), from_queue="qa")
            elif name == "c03":  # an outlier: the run was stuck for a while
                ran(h, name, 10 * secs(name, h))
            else:
                ran(h, name, secs(name, h))
    ran("b", "c01", 0.5, rc=1)  # a failed rerun: not a duration of the cell
    ran("b", "c04", 0.1, resume=1)  # a resumed run: only part of the cell
    for h, lst in evs.items():
        path = lp.shared / "events" / f"{h}.q{h}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(e) + "\n" for e in lst))
    return {"spu": spu, "speed": true_speed, "cells": cells}


def test_learned_model_recovers_task_and_host_speeds_from_event_files(local_project: LocalProject) -> None:
    lp = local_project
    truth = _synthetic_history(lp)
    project = load_project(lp.root)
    model = load_model(project)
    assert model.learned and model.source == "learned"
    assert (model.cells, model.outliers) == (23, 1)  # c03 left out; c01's failure, c04's resume ignored
    for task, s in truth["spu"].items():
        assert model.spu[task] == pytest.approx(s)
    for host, s in truth["speed"].items():
        assert model.speed(host) == pytest.approx(s)  # b is learned slow though declared 1.0
    assert model.speed("c") == pytest.approx(0.8)  # no history: declared
    c05 = truth["cells"]["c05"]  # recon, 2 epochs: cost 2, 4 s at speed 1
    assert model.seconds(c05, "b") == pytest.approx(8.0)
    assert model.seconds(c05, "c") == pytest.approx(5.0)
    js = model.to_json()
    assert js["hosts"]["b"] == {"speed": 0.5, "source": "learned", "cells": 8, "overhead_seconds": 0.0}
    assert js["hosts"]["d"]["cells"] == 9  # its own eight and the stolen c00
    assert js["hosts"]["c"] == {"speed": 0.8, "source": "declared", "cells": 0, "overhead_seconds": 0.0}
    assert model.describe() == "learned from 23 cell(s), 1 outlier(s) left out"

    # A task without history takes the pooled seconds per cost unit.
    tasks = {"recon": {"epochs": 3, "cost_per_epoch": 1.0}, "det": {"epochs": 2, "cost_per_epoch": 2.5},
             "seg": {"epochs": 1, "cost_per_epoch": 1.0}}
    lp.write_config(hosts={"a": {"speed": 1.0}, "b": {"speed": 1.0}, "c": {"speed": 0.8},
                           "d": {"speed": 1.5}}, tasks=tasks)
    model = load_model(load_project(lp.root))
    assert model.global_spu is not None and 0.8 < model.global_spu < 2.0
    assert model.seconds(Cell("n/s.yaml", "seg", 1), "a") == pytest.approx(model.global_spu)
    assert model.to_json()["tasks"]["seg"]["source"] == "pooled"


def test_plan_balances_on_the_learned_model_and_is_deterministic(local_project: LocalProject) -> None:
    lp = local_project
    _synthetic_history(lp)
    project = load_project(lp.root)
    first = plan(project, write=False)
    assert first.to_json() == plan(project, write=False).to_json()
    out = first.to_json()
    assert out["model"]["source"] == "learned" and out["model"]["cells"] == 23
    by = {q.machine.host: q for q in first.queues}
    assert by["b"].machine.speed == pytest.approx(0.5)
    # balanced in seconds: b (learned half speed) gets about half of a's expected work
    assert by["b"].load is not None and by["a"].load is not None
    assert by["b"].load < 0.75 * by["a"].load
    for q in out["queues"]:
        assert q["eta_seconds"] == pytest.approx(q["finish"])
        assert q["eta_seconds"] > 0
    assert out["eta_seconds"] == pytest.approx(out["makespan"]) == pytest.approx(
        max(q["eta_seconds"] for q in out["queues"]))
    assert out["lower_bound"] <= out["makespan"] <= 1.3 * out["lower_bound"]
    assert first.model is not None
    for q in first.queues:  # longest first in every queue
        w = [first.model.weight(c) for c in q.cells]
        assert w == sorted(w, reverse=True)
    assert any("plan ETA" in line and "learned from 23 cell(s)" in line for line in first.lines())


def test_estimates_file_declared_and_learned(local_project: LocalProject) -> None:
    lp = local_project
    lp.write_config(hosts={"a": {"speed": 1.0}, "g": {"speed": 0.7, "gpus": [0, 3]}})
    lp.queue("qa", [lp.cfg("cfgs/x/one.yaml") + " recon 2", lp.cfg("cfgs/x/two.yaml") + " det 4"])
    fs = LocalFS(str(lp.shared))
    project = load_project(lp.root)
    got = write_estimates(project, fs)
    head, hosts, cells = estimates(lp)
    assert head[:3] == ["#", "ablate", "estimates"] and head[3].isdigit() and head[4] == "declared"
    assert got.model.source == "declared" and got.cells == 2
    assert hosts == {("a", "-"): 1000, ("g", "0"): 700, ("g", "3"): 700}
    assert cells == {"one": 2000, "two": 10000}  # declared cost x 1000

    _synthetic_history(lp)  # hosts a, b, c, d now; qa, qb, qd with history
    project = load_project(lp.root)
    snap = Snapshot.parse(snapshot({"root": str(lp.shared), "touch": False}))
    write_estimates(project, fs, snap)
    head, hosts, cells = estimates(lp)
    assert head[4] == "learned"
    assert hosts == {("a", "-"): 1000, ("b", "-"): 500, ("c", "-"): 800, ("d", "-"): 1500}
    model = learn(project, snap)
    for name, c in {ln.cell.name: ln.cell for q in ("qa", "qb", "qd")
                    for ln in read_queue(project, q).cells if ln.cell}.items():
        assert cells[name] == round(cost.declared_cost(project, c) * model.spu[c.task] * 1000)
    assert cells["c05"] == 4000  # recon 2 epochs: 2 cost units x 2.0 s on a speed-1.0 machine


def test_the_controller_and_a_draining_runner_expect_the_same_seconds(local_project: LocalProject) -> None:
    """`plan`/`status` ETAs and a runner's steal come from one model: the controller's seconds of
    every cell on every runner equal what the runners' helper (learn.py in runner.<sha>.pyz, on the same
    estimates.tsv and events files) writes for run_queue: over + cell ms / speed."""
    lp = local_project
    truth = _synthetic_history(lp)
    for h, q in (("a", "qa"), ("d", "qd")):  # a fixed start-up on a and d: learned as overhead
        path = lp.shared / "events" / f"{h}.{q}.jsonl"
        evs = [json.loads(line) for line in path.read_text().splitlines()]
        for e in evs:
            if e["ev"] == "end" and e["cell"] != "c03":
                e["dur"] += 1.5
        path.write_text("".join(json.dumps(e) + "\n" for e in evs))
    project = load_project(lp.root)
    fs = LocalFS(str(lp.shared))
    model = write_estimates(project, fs).model
    assert model.learned and model.overhead("a") > 1.0 > model.overhead("b")
    evs = [json.loads(line) for f in sorted((lp.shared / "events").glob("*.jsonl"))
           for line in f.read_text().splitlines()]
    text = learned_text((lp.shared / "estimates.tsv").read_text(), evs, 0.0)
    assert text is not None
    rows = [r.split("\t") for r in text.splitlines()[1:]]
    speed = {f[1]: int(f[3]) / 1000 for f in rows if f[0] == "host"}
    over = {f[1]: int(f[3]) / 1000 for f in rows if f[0] == "over"}
    ms = {f[1]: int(f[2]) for f in rows if f[0] == "cell"}
    assert speed["b"] < 0.7  # declared 1.0: learned slow, the same on both sides
    for name, c in truth["cells"].items():
        for host in ("a", "b", "c", "d"):
            runner = over[host] + ms[name] / 1000 / speed[host]
            assert model.seconds(c, host) == pytest.approx(runner, rel=2e-3, abs=2e-3), (name, host)


# --------------------------------------------------------------------------- a real local sweep


@pytest.fixture
def _tmux() -> None:
    require_tmux()


@pytest.mark.tmux
def test_eta_in_plan_and_status_before_and_after_history(
        _tmux: None, local_project: LocalProject, cli: Cli) -> None:
    lp = local_project
    for i in range(4):
        lp.cfg(f"cfgs/r/q{i}.yaml", seed=i)
    lp.write_config(cells=[{"glob": "cfgs/r/*.yaml", "task": "recon", "epochs": 1}])

    code, out, _ = cli(lp, "plan", "--json")
    planned = json.loads(out)
    assert code == 0 and planned["eta_seconds"] is None and planned["model"]["source"] == "declared"
    assert planned["model"]["cells"] == 0 and all(q["eta_seconds"] is None for q in planned["queues"])
    code, out, _ = cli(lp, "plan", "--dry-run")
    assert "plan ETA unknown: no cell has finished yet (declared costs; no history yet)" in out
    code, out, _ = cli(lp, "status", "--json")
    st = json.loads(out)
    assert st["eta"] is None and st["model"]["source"] == "declared"
    assert all(q["eta"] is None for q in st["queues"])
    code, out, _ = cli(lp, "status")
    assert "sweep ETA unknown: no cell has finished yet (declared costs; no history yet)" in out

    project = load_project(lp.root)
    launch_all(project)
    head, hosts, cells = estimates(lp)
    assert head[4] == "declared" and hosts == {("h1", "-"): 1000, ("h2", "-"): 500}
    assert cells == {f"q{i}": 1000 for i in range(4)}
    wait_drained(lp, [("h1", "h1"), ("h2", "h2")])

    code, out, _ = cli(lp, "status", "--json")
    st = json.loads(out)
    assert st["model"]["source"] == "learned" and st["model"]["cells"] == 4
    assert [q["eta"] for q in st["queues"]] == [0.0, 0.0] and st["eta"] == 0.0

    # A long cell appended to a drained queue: it is relaunched, with learned estimates.
    n = len(events(lp, "h1", "h1"))
    res = append(project, "h1", lp.cfg("cfgs/s/slow.yaml", step_time=0.2), "recon", 100)
    assert res.restarted is not None
    head, _, cells = estimates(lp)
    assert head[4] == "learned" and cells["slow"] == pytest.approx(100 * cells["q0"], rel=0.01)

    def running_slow() -> dict[str, Any] | None:
        _, out, _ = cli(lp, "status", "--json")
        rows = {q["queue"]: q for q in json.loads(out)["queues"]}
        return json.loads(out) if rows["h1"]["current"] == "slow" and rows["h1"]["elapsed"] else None

    st = wait_for(running_slow, timeout=30)
    assert isinstance(st, dict)
    rows = {q["queue"]: q for q in st["queues"]}
    model = learn(project, Snapshot.parse(snapshot({"root": str(lp.shared), "touch": False})))
    expect = model.seconds(Cell("cfgs/s/slow.yaml", "recon", 100), "h1")
    assert expect is not None and expect > 10
    assert rows["h1"]["eta"] == pytest.approx(expect - rows["h1"]["elapsed"], rel=0.05)
    assert rows["h2"]["eta"] == 0.0 and st["eta"] == rows["h1"]["eta"]
    code, out, _ = cli(lp, "status")
    assert "sweep ETA " in out and "(learned from 4 cell(s))" in out

    code, out, _ = cli(lp, "plan", "--dry-run", "--json")
    planned = json.loads(out)
    assert planned["model"]["source"] == "learned" and planned["eta_seconds"] == planned["makespan"] > 0
    # Appended to the live queue: no relaunch, but the new cell's estimate is written.
    live = append(project, "h1", lp.cfg("cfgs/s/after.yaml"), "recon", 3)
    assert live.live and live.restarted is None
    _, _, cells = estimates(lp)
    assert cells["after"] == pytest.approx(3 * cells["q0"], rel=0.01)
    stop(project, "h1", "h1")
    assert n < len(events(lp, "h1", "h1"))


# --------------------------------------------------------------------------- GPU slots and budget


GPU_TRAINER = f'''
import json, os, sys
sys.path.insert(0, {str(Path(demo_train.__file__).parent)!r})
from train import main
args = sys.argv[1:]
gpu = args[args.index("--gpu") + 1]
del args[args.index("--gpu"):args.index("--gpu") + 2]
rc = main(args)
out = args[args.index("--out") + 1]
path = os.path.join(out, "metrics.json")
m = json.load(open(path))
m.update(cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), gpu_field=gpu)
json.dump(m, open(path, "w"))
sys.exit(rc)
'''


def _gpu_project(lp: LocalProject, ckpt_size: int, scratch: int) -> None:
    (lp.root / "gpu_train.py").write_text(GPU_TRAINER)
    for i in range(4):
        lp.cfg(f"cfgs/g/c{i}.yaml", seed=i)
    lp.write_config(
        train=f"{sys.executable} gpu_train.py --config {{cfg}} --epochs {{epochs}} --out {{ckpt_dir}} "
              "--resume {resume} --gpu {gpu}",
        cells=[{"glob": "cfgs/g/*.yaml", "task": "recon", "epochs": 1}],
        hosts={"g": {"speed": 1.0, "gpus": [0, 1]}},
        budget={"ckpt_size": ckpt_size, "scratch": scratch})


@pytest.mark.tmux
def test_two_slot_host_runs_two_queues_each_pinned_to_its_gpu(_tmux: None,
                                                               local_project: LocalProject) -> None:
    lp = local_project
    free = shutil.disk_usage(lp.root).free
    # Scratch is counted once per host: 0.6 of the free space fits once, not once per slot queue.
    _gpu_project(lp, 1000, int(free * 0.6))
    project = load_project(lp.root)
    res = plan(project)
    assert [(q.queue, q.machine.slot) for q in res.queues] == [("g-g0", 0), ("g-g1", 1)]
    assert all(len(q.cells) == 2 for q in res.queues)
    results = launch_all(project)
    assert [(r.queue, r.status, r.slot) for r in results] == [("g-g0", "launched", 0),
                                                             ("g-g1", "launched", 1)]
    wait_drained(lp, [("g", "g-g0"), ("g", "g-g1")])
    slot_of = {"g-g0": "0", "g-g1": "1"}
    seen = set()
    for i in range(4):
        cell_dir = lp.shared / "final_ckpts" / f"c{i}"
        queue = json.loads((cell_dir / "MANIFEST.json").read_text())["queue"]
        metrics = json.loads((cell_dir / "metrics.json").read_text())
        assert metrics["cuda_visible_devices"] == slot_of[queue] == metrics["gpu_field"], (i, queue, metrics)
        seen.add(queue)
    assert seen == {"g-g0", "g-g1"}
    for q, slot in (("g-g0", 0), ("g-g1", 1)):
        assert [e["slot"] for e in events(lp, "g", q) if e["ev"] == "queue_start"] == [slot]


@pytest.mark.tmux
def test_disk_budget_is_per_host_over_its_slot_queues(_tmux: None, local_project: LocalProject) -> None:
    lp = local_project
    free = shutil.disk_usage(lp.root).free
    # 0.3 of the free space per checkpoint: one slot queue's 2 cells fit, the host's 4 do not.
    _gpu_project(lp, int(free * 0.3), 1000)
    project = load_project(lp.root)
    plan(project)
    with pytest.raises(CheckFailed) as ei:
        launch(project, "g-g0", "g")
    msg = ei.value.message
    assert ei.value.exit_code == 1
    assert "g: disk below budget: need" in msg and "(4 cell(s) x" in msg and "scratch), free" in msg, msg
    results = launch_all(project)
    assert [(r.status, "(4 cell(s) x" in (r.error or "")) for r in results] == [("failed", True)] * 2
    assert not (lp.shared / "queues" / "g-g0.ledger").exists()
    assert not (lp.shared / "queues" / "g-g1.ledger").exists()
    assert not (lp.shared / "events").exists()
