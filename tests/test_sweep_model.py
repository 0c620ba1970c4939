"""One sweep model (ablate/sweep/snapshot.py): every command reads the same typed snapshot with the
same liveness rule and classification, so none can disagree about a queue or a cell."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from ablate.sweep.ledger import prefix_sha256
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py


def _queue_states(cli: Cli, p: LocalProject) -> dict[str, str]:
    return {q["queue"]: q["state"] for q in cli.json(p, "status")["queues"]}


def _fabricate_queue_on_a_lost_link(p: LocalProject, e: str, f: str) -> None:
    """Queue q4 ran on h3 (which does not answer now): cell e crashed, then the queue drained; its
    heartbeat, fresh, says drained. Written as run_queue writes it."""
    lines = ["# ablate: host=h3", f"{e} recon", f"{f} recon"]
    p.queue("q4", lines)
    now = time.time()
    root = p.shared
    (root / "queues").mkdir(parents=True, exist_ok=True)
    (root / "queues" / "q4.txt").write_text("".join(ln + "\n" for ln in lines))
    entry = {"t": now, "host": "h3", "slot": None, "start_index": 0, "lines": 3,
             "prefix_sha256": prefix_sha256(lines), "spec": None, "run_queue": None, "op": "launch"}
    (root / "queues" / "q4.ledger").write_text(json.dumps(entry) + "\n")
    (root / "claims" / "e").mkdir(parents=True)
    (root / "claims" / "e" / "owner").write_text(f"h3 q4 1 {now}\n")
    events = [{"t": now, "ev": "queue_start", "host": "h3", "queue": "q4", "start_index": 0, "slot": None},
              {"t": now, "ev": "start", "host": "h3", "queue": "q4", "idx": 1, "cell": "e", "resume": 0},
              {"t": now, "ev": "end", "host": "h3", "queue": "q4", "idx": 1, "cell": "e", "rc": 1,
               "dur": 1.0},
              {"t": now, "ev": "queue_end", "host": "h3", "queue": "q4", "idx": 3}]
    (root / "events").mkdir(parents=True, exist_ok=True)
    (root / "events" / "h3.q4.jsonl").write_text("".join(json.dumps(ev) + "\n" for ev in events))
    (root / "tails").mkdir(parents=True, exist_ok=True)
    (root / "tails" / "e.log").write_text("Traceback (most recent call last):\nValueError: boom\n")
    hb = {"t": now, "host": "h3", "queue": "q4", "slot": None, "pid": 1, "pgid": 1, "state": "drained",
          "idx": 3, "cell": "e", "cell_started": None, "from_queue": None, "log_mtime": None,
          "log_size": None, "run_queue": None, "spec": None}
    (root / "heartbeats").mkdir(parents=True, exist_ok=True)
    (root / "heartbeats" / "h3.q4").write_text(json.dumps(hb))


def test_every_command_reports_each_queue_and_cell_the_same_way(
        local_project: LocalProject, cli: Cli) -> None:
    require_tmux()
    p = local_project
    # h3 is reached over ssh at a name that never resolves: it does not answer.
    p.write_config(workdir=str(p.root), steal=False,
                   hosts={"h1": {"speed": 1.0}, "h2": {"speed": 1.0},
                          "h3": {"transport": "ssh", "ssh": "h3.invalid"}})
    a, b = p.cfg("cfgs/x/a.yaml"), p.cfg("cfgs/x/b.yaml")
    c = p.cfg("cfgs/x/c.yaml", step_time=0.5)
    d, e, f = p.cfg("cfgs/x/d.yaml"), p.cfg("cfgs/x/e.yaml"), p.cfg("cfgs/x/f.yaml")
    p.queue("q1", ["# ablate: host=h1", f"{a} recon", f"{b} recon"])
    p.queue("q2", ["# ablate: host=h2", f"{c} recon 40"])
    p.queue("q3", ["# ablate: host=h1", f"{d} recon"])
    cli.json(p, "launch", "q1", "--host", "h1")
    cli.json(p, "launch", "q2", "--host", "h2")
    wait_for(lambda: _queue_states(cli, p)["q1"] == "drained", timeout=60, interval=0.3)
    _fabricate_queue_on_a_lost_link(p, e, f)
    cli.json(p, "pull")
    cli.json(p, "reconcile", code=1)
    wait_for(lambda: cli.json(p, "status")["cells"]["c"]["state"] == "running", timeout=30, interval=0.3)

    status = cli.json(p, "status")
    queues = {q["queue"]: q["state"] for q in status["queues"]}
    # h3 does not answer and its fresh heartbeat says drained: drained, not running.
    assert queues == {"q1": "drained", "q2": "running", "q3": "not_launched", "q4": "drained"}
    cells = {n: c["state"] for n, c in status["cells"].items()}
    assert cells == {"a": "verified", "b": "verified", "c": "running", "d": "never_ran", "e": "crashed",
                     "f": "never_ran"}
    assert "drained without running it" in status["cells"]["f"]["reason"]
    assert status["cells"]["d"]["pending"] == "q3"
    assert "h3" in status["unreachable"]

    # reconcile classifies the cells it did not verify exactly as status does.
    rec = cli.json(p, "reconcile", code=1)
    unverified = {n: s for n, s in cells.items() if s != "verified"}
    assert {n: c["state"] for n, c in rec["cells"].items()} == unverified
    assert rec["states"] == status["states"]
    # The report counts the same states.
    assert cli.json(p, "report")["states"] == status["states"]
    # logs finds the running cell where status says it runs, and the crashed one's kept tail.
    r = cli(p, "logs", "c", "-n", "1")
    assert r.code == 0 and "c: running on h2 (queue q2)" in r.output
    r = cli(p, "logs", "e")
    assert r.code == 0 and "ValueError: boom" in r.output
    # release: the live queue on h2 refuses it; h3's drained queue is not live, so it is not named.
    r = cli(p, "release", "h2", "--yes")
    assert r.code == 1 and "queue q2 is live on h2" in r.output
    r = cli(p, "release", "h3", "--yes")
    assert r.code == 1 and "q4" not in r.output and "not complete" in r.output
    # remediate decides from the same states, and re-runs exactly the cells that need it.
    rem = cli.json(p, "remediate")
    assert rem["states"] == status["states"]
    assert set(rem["targets"]) == {"d", "e", "f"}
    cli.json(p, "stop", "q2", "--host", "h2")


def test_a_released_host_shows_its_approval_not_idle_costing_money(
        local_project: LocalProject, cli: Cli) -> None:
    require_tmux()
    p = local_project
    p.write_config(steal=False, monitor={"idle_after": "1s"})
    one = p.cfg("cfgs/x/one.yaml")
    p.queue("q1", ["# ablate: host=h1", f"{one} recon"])
    cli.json(p, "launch", "q1", "--host", "h1")
    wait_for(lambda: _queue_states(cli, p)["q1"] == "drained", timeout=60, interval=0.3)

    def alarms() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = cli.json(p, "status")["idle_hosts"]
        return got

    wait_for(alarms, timeout=15, interval=0.3)
    [idle] = alarms()
    assert idle["state"] == "idle_costing_money"
    assert idle["next"] == "ablate reconcile, then ablate release h1"
    cli.json(p, "pull")
    cli.json(p, "reconcile")
    assert cli.json(p, "release", "h1", "--yes")["message"] == "safe to release h1"

    [approved] = alarms()  # h2 never ran anything and was never approved: not listed
    assert approved["host"] == "h1" and approved["state"] == "release_approved"
    assert "platform's console" in approved["next"] and approved["approved"]["ran"] is None
    assert time.time() - approved["approved"]["t"] < 120
    r = cli(p, "status")
    assert r.code == 0 and "host h1 release_approved" in r.output and "idle_costing_money" not in r.output
    assert "release it in the platform's console" in r.output


def test_a_malformed_file_from_another_controller_is_a_named_warning_everywhere(
        local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    one = p.cfg("cfgs/x/one.yaml")
    p.queue("q1", ["# ablate: host=h1", f"{one} recon"])
    (p.shared / "queues").mkdir(parents=True)
    (p.shared / "queues" / "zz.txt").write_text("this is not a queue line\n")  # another ablate.yaml's
    (p.shared / "heartbeats").mkdir(parents=True)
    (p.shared / "heartbeats" / "h1.zz").write_text("{torn")
    want = "queues/zz.txt on the shared FS (another controller's) is not a queue"

    status = cli.json(p, "status")
    assert any(want in w for w in status["warnings"])
    assert any("heartbeats/h1.zz" in w for w in status["warnings"])
    r = cli(p, "status")
    assert r.code == 0 and f"warning: {want}" in r.output
    for args, expected in ((("reconcile", "--fs"), 1), (("pull",), 0), (("report",), 0),
                           (("remediate",), 0), (("release", "h1", "--yes"), 1), (("logs", "one"), 1)):
        r = cli(p, *args)
        assert r.code == expected and "Traceback" not in r.output, (args, r.output)
        assert r.output.count(f"warning: {want}") == 1, (args, r.output)
