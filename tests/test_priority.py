"""Priorities (`priority:` per `cells` entry, `priority=N` per queue line): the planner keeps the
cost balance but runs each queue's higher priorities first; a draining runner steals the highest
priority it can finish sooner; `plan` and `status` show them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.plan.planner import plan
from ablate.run.launch import launch
from ablate.sweep.cells import parse_line
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject, drained, events
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for


def test_a_line_priority_orders_but_is_not_part_of_the_identity(local_project: LocalProject) -> None:
    tasks = load_project(local_project.root).tasks
    hi = parse_line("c/a.yaml recon 3 priority=2", tasks, "q:1")
    plain = parse_line("c/a.yaml recon 3", tasks, "q:2")
    assert hi is not None and plain is not None
    assert hi.priority == 2 and plain.priority == 0 and hi == plain  # one cell
    assert hi.queue_line == "c/a.yaml recon 3 priority=2" and plain.queue_line == "c/a.yaml recon 3"
    neg = parse_line("c/b.yaml recon priority=-1", tasks, "q:3")
    assert neg is not None and neg.priority == -1 and neg.epochs == 3


@pytest.mark.parametrize("line", ["c/a.yaml recon 3 priority=high", "c/a.yaml recon priority=1.5",
                                  "c/a.yaml recon 3 priority="])
def test_a_bad_priority_is_refused_naming_the_line(local_project: LocalProject, cli: Cli, line: str) -> None:
    local_project.queue("q1", [line])
    before = local_project.snapshot()
    code, out, err = cli(local_project, "plan")
    assert code == 2 and out == "" and "queues/q1.txt:1" in err and "priority" in err
    assert local_project.snapshot() == before


def _cells(lp: LocalProject, with_priority: bool) -> None:
    for i in range(6):
        lp.cfg(f"configs/core/core{i}.yaml", seed=i)
        lp.cfg(f"configs/exp/exp{i}.yaml", seed=i)
    core: dict[str, Any] = {"glob": "configs/core/*.yaml", "task": "recon"}
    exp: dict[str, Any] = {"glob": "configs/exp/*.yaml", "task": "det"}
    if with_priority:
        core["priority"] = 2
    lp.write_config(cells=[core, exp])


def test_plan_runs_priorities_first_in_each_queue_and_keeps_the_cost_balance(
        local_project: LocalProject, cli: Cli) -> None:
    lp = local_project
    _cells(lp, with_priority=False)
    plain = plan(load_project(lp.root), write=False)
    _cells(lp, with_priority=True)
    ranked = plan(load_project(lp.root), write=False)
    # the same cells on the same queues (the balance is by cost), the same makespan
    assert [sorted(c.name for c in q.cells) for q in ranked.queues] == \
        [sorted(c.name for c in q.cells) for q in plain.queues]
    assert ranked.makespan == plain.makespan
    for q in ranked.queues:
        prios = [c.priority for c in q.cells]
        assert prios == sorted(prios, reverse=True) and set(prios) == {0, 2}, q.text()
        assert all(line.endswith(" priority=2") == line.split("/")[1].startswith("core")
                   for line in q.text().splitlines()[1:])
    out = cli.json(lp, "plan")
    assert all(set(q["priorities"].values()) == {2} and all(n.startswith("core") for n in q["priorities"])
               for q in out["queues"])
    text = cli(lp, "plan", "--dry-run").out
    for q in ranked.queues:
        n2 = sum(1 for c in q.cells if c.priority == 2)
        n0 = len(q.cells) - n2
        assert (f"{q.queue}: by priority: 2: {n2} cell{'s' if n2 != 1 else ''}, "
                f"0: {n0} cell{'s' if n0 != 1 else ''}") in text


@pytest.mark.tmux
def test_a_draining_runner_steals_the_highest_priority_cell(local_project: LocalProject, cli: Cli) -> None:
    require_tmux()
    lp = local_project
    slow = lp.cfg("cfgs/v/slow.yaml", step_time=0.6)
    lines = [f"{slow} recon 20", lp.cfg("cfgs/v/lo1.yaml") + " recon 1",
             lp.cfg("cfgs/v/hi.yaml") + " recon 1 priority=5", lp.cfg("cfgs/v/lo2.yaml") + " recon 1"]
    lp.queue("q2", ["# ablate: host=h2", *lines])
    lp.queue("q1", ["# ablate: host=h1", lp.cfg("cfgs/t/quick.yaml") + " recon 1"])
    launch(load_project(lp.root), "q2", "h2")
    wait_for(lambda: any(e["ev"] == "start" and e["cell"] == "slow" for e in events(lp, "h2", "q2")),
             timeout=30)
    launch(load_project(lp.root), "q1", "h1")
    steals = wait_for(lambda: [e for e in events(lp, "h1", "q1") if e["ev"] == "steal"], timeout=60)
    assert isinstance(steals, list)
    assert steals[0]["cell"] == "hi" and steals[0]["from_queue"] == "q2"  # not lo2, the last line
    st = cli(lp, "status").out
    assert "q2 by priority: 5: hi, 0: slow lo1 lo2" in st
    q2 = json.loads(cli(lp, "status", "--json").out)["queues"]
    assert next(r for r in q2 if r["queue"] == "q2")["priorities"] == {"hi": 5}
    cli(lp, "stop", "q2", "--host", "h2")
    drained(lp, "h1", "q1")
