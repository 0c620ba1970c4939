"""Services beside the trainer (`services:` in ablate.yaml), with a real HTTP server process as the
service (tests/helpers/svc_server.py) and a trainer that talks to it before training
(tests/helpers/svc_train.py): started and waited for before the first cell, on its own port,
stopped with the queue; one that never becomes ready fails the queue before any cell; one that dies
mid-cell fails that cell as `service_down`, is restarted, and remediate re-runs the cell."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from ablate.config.project import load_project
from ablate.monitor.status import status
from ablate.monitor.watch import render
from ablate.run.deploy import render_spec
from ablate.run.launch import launch
from ablate.transport import close_all
from tests.helpers import svc_server, svc_train
from tests.helpers.cli import Cli
from tests.helpers.proc import alive
from tests.helpers.project import LocalProject, drained, events
from tests.helpers.testbed_projects import TRAIN_IN_WORKDIR, make_project
from tests.helpers.testbed_projects import events as tb_events
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for
from tests.testbed import Testbed


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def free_port() -> int:
    """A base port with the next 16 free too (queue k of a host uses base + k)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base <= 65000 and all(bindable(base + k) for k in range(16)):
            return base
    raise AssertionError("no free port range")


def port_free(port: int) -> bool:
    """Nothing listens on it (a closed server's connections may linger in TIME_WAIT: no matter)."""
    with socket.socket() as s:
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            return True
    return False


def bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def setup(lp: LocalProject, *, server: str = "", scope: str = "queue", timeout: int = 30,
          field: str = "port") -> int:
    port = free_port()
    pidfile = lp.root / "svc.pid"
    train = (f"{sys.executable} {svc_train.__file__} --url http://127.0.0.1:{{{field}}}/ --out {{ckpt_dir}} "
             f"-- {sys.executable} -m ablate.demo.train --config {{cfg}} --epochs {{epochs}} "
             "--out {ckpt_dir} --resume {resume}")
    lp.write_config(train=train, steal=False, services=[{
        "name": "srv", "port": port, "scope": scope,
        "command": f"{sys.executable} {svc_server.__file__} --port {{port}} --pidfile {pidfile} {server}",
        "ready": {"http": "http://127.0.0.1:{port}/health", "timeout": timeout}}])
    return port


def served_by(lp: LocalProject, cell: str) -> int:
    data: dict[str, Any] = json.loads((lp.root / f".ablate/local/h1/ckpt/{cell}/service.json").read_text())
    return int(data["pid"])


def kinds(evs: list[dict[str, Any]]) -> list[str]:
    return [e["ev"] for e in evs]


@pytest.mark.tmux
def test_service_is_ready_before_the_first_cell_and_stops_with_the_queue(
        local_project: LocalProject, cli: Cli) -> None:
    lp = local_project
    port = setup(lp, server="--ready-after 1.5")
    lp.queue("q1", [lp.cfg("cfgs/a/one.yaml") + " recon 1", lp.cfg("cfgs/a/two.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    evs = drained(lp, "h1", "q1")
    assert kinds(evs) == ["queue_start", "service_start", "service_ready", "start", "synced", "end",
                          "start", "synced", "end", "queue_end"]
    assert evs[1]["port"] == port and evs[2]["t"] - evs[1]["t"] >= 1.4  # waited until it answered
    pid = int((lp.root / "svc.pid").read_text())
    assert served_by(lp, "one") == served_by(lp, "two") == pid  # one server for the whole queue
    assert not alive(pid) and port_free(port)  # stopped with the queue
    hb = json.loads((lp.shared / "heartbeats" / "h1.q1").read_text())
    assert hb["state"] == "drained" and hb["services"]["srv"]["state"] == "stopped"
    log = (lp.root / ".ablate/local/h1/ckpt/.ablate-services/q1.srv.log").read_text()
    assert f"svc_server: listening on port {port}" in log
    assert cli.json(lp, "reconcile", "--fs")["verified"] == 2


@pytest.mark.tmux
def test_a_service_that_never_becomes_ready_fails_the_queue_before_any_cell(
        local_project: LocalProject, cli: Cli) -> None:
    lp = local_project
    port = setup(lp, server="--never-ready", timeout=3)
    lp.queue("q1", [lp.cfg("cfgs/a/one.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    evs = wait_for(lambda: (e := events(lp, "h1", "q1")) and e[-1]["ev"] == "queue_stop" and e, timeout=30)
    assert isinstance(evs, list)
    assert kinds(evs) == ["queue_start", "service_start", "service_failed", "queue_stop"]
    failed = evs[2]
    assert failed["reason"] == "not ready after 3s"
    assert "never ready: the model failed to load" in failed["tail"]
    assert not (lp.shared / "claims" / "one").exists()  # no cell was claimed, none started
    kept = (lp.shared / "services" / "h1.q1.srv.log").read_text()
    assert "never ready" in kept
    wait_for(lambda: port_free(port), timeout=20)
    st = cli.json(lp, "status")
    assert st["cells"]["one"]["state"] == "never_ran"
    assert "service srv not ready after 3s" in st["cells"]["one"]["reason"]
    [row] = st["queues"]
    assert row["state"] == "stopped" and row["services"]["srv"]["state"] == "failed"


@pytest.mark.tmux
def test_a_service_dying_mid_cell_fails_that_cell_as_service_down_then_remediate_reruns_it(
        local_project: LocalProject, cli: Cli) -> None:
    lp = local_project
    setup(lp)
    lp.queue("q1", [lp.cfg("cfgs/a/slow.yaml", step_time=0.5) + " recon 30",
                    lp.cfg("cfgs/a/after.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    wait_for(lambda: (lp.root / ".ablate/local/h1/ckpt/slow/service.json").exists(), timeout=30)
    first = int((lp.root / "svc.pid").read_text())
    os.kill(first, signal.SIGKILL)  # the inference server crashes under the running cell

    evs = drained(lp, "h1", "q1")
    down = [e for e in evs if e["ev"] == "service_down"]
    assert len(down) == 1 and down[0]["cell"] == "slow" and down[0]["service"] == "srv"
    end = next(e for e in evs if e["ev"] == "end" and e["cell"] == "slow")
    assert end["reason"] == "service_down" and end["rc"] != 0
    assert kinds(evs).count("service_start") == 2  # restarted for the next cell
    second = int((lp.root / "svc.pid").read_text())
    assert second != first and served_by(lp, "after") == second
    st = cli.json(lp, "status")
    assert st["cells"]["slow"]["state"] == "service_down"
    assert "its service srv died" in st["cells"]["slow"]["reason"]
    assert st["cells"]["after"]["state"] == "synced"

    rem = cli.json(lp, "remediate", "--launch")
    assert "slow" in json.dumps(rem)
    wait_for(lambda: cli.json(lp, "status")["cells"]["slow"]["state"] == "synced", timeout=90)


@pytest.mark.tmux
def test_a_cell_scoped_service_runs_around_each_cell(local_project: LocalProject) -> None:
    lp = local_project
    port = setup(lp, scope="cell", field="port_srv")  # the train template names the service
    lp.queue("q1", [lp.cfg("cfgs/a/one.yaml") + " recon 1", lp.cfg("cfgs/a/two.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    evs = drained(lp, "h1", "q1")
    assert kinds(evs) == ["queue_start", "start", "service_start", "service_ready", "synced", "end",
                          "start", "service_start", "service_ready", "synced", "end", "queue_end"]
    assert served_by(lp, "one") != served_by(lp, "two")  # a fresh server per cell
    assert not alive(served_by(lp, "two")) and port_free(port)


@pytest.mark.tmux
def test_stop_stops_the_services_too(local_project: LocalProject, cli: Cli) -> None:
    lp = local_project
    port = setup(lp)
    lp.queue("q1", [lp.cfg("cfgs/a/slow.yaml", step_time=0.5) + " recon 40"])
    launch(load_project(lp.root), "q1", "h1")
    wait_for(lambda: (lp.root / ".ablate/local/h1/ckpt/slow/service.json").exists(), timeout=30)
    pid = int((lp.root / "svc.pid").read_text())
    # the dashboard (`status --watch`) and `status` show the service, its state and port
    console = Console(record=True, width=160, color_system=None)
    console.print(render(status(load_project(lp.root))))
    assert f"service srv of q1: ready :{port}" in console.export_text()
    assert f"services of q1: srv ready :{port}" in cli(lp, "status").out
    assert cli(lp, "stop", "q1", "--host", "h1").code == 0
    assert not alive(pid) and port_free(port)
    assert cli.json(lp, "status")["cells"]["slow"]["state"] == "interrupted"


def test_gpus_split_between_trainers_and_services(local_project: LocalProject) -> None:
    lp = local_project
    setup(lp)
    cfg = yaml.safe_load((lp.root / "ablate.yaml").read_text())
    cfg["services"][0]["gpus"] = 1
    cfg["hosts"] = {"h1": {"gpus": [0, 1, 2, 3, 5]}}
    lp.write_config(**cfg)
    project = load_project(lp.root)
    h = project.hosts["h1"]
    assert h.slots == (0, 2)  # two queues; GPU 5 is left over
    assert h.queue_gpus(2) == (1, (3,))
    spec = render_spec(project, h, "/x/run_one.sh").decode()
    assert "ABLATE_SVC_SLOTS='0:0:1 2:1:3'" in spec



def test_doctor_checks_each_service_command_and_port(local_project: LocalProject) -> None:
    from ablate.doctor.command import doctor

    lp = local_project
    port = setup(lp)
    report = doctor(load_project(lp.root), ["h1"])
    ok = report.check("h1", "service srv") or pytest.fail(str(report.lines()))
    assert ok.ok and f"port(s) {port} free" in ok.reason and "found" in ok.reason

    with socket.socket() as busy:  # something else listens on the service's port
        busy.bind(("127.0.0.1", port))
        busy.listen()
        got = doctor(load_project(lp.root), ["h1"]).check("h1", "service srv") or pytest.fail()
    assert not got.ok and f"port(s) {port} on h1 are in use" in got.reason
    assert "services[0].port" in got.reason

    cfg = yaml.safe_load((lp.root / "ablate.yaml").read_text())
    cfg["services"][0]["command"] = "vllm-serve-not-installed --port {port}"
    lp.write_config(**cfg)
    got = doctor(load_project(lp.root), ["h1"]).check("h1", "service srv") or pytest.fail()
    assert not got.ok and "vllm-serve-not-installed not found on h1" in got.reason


def test_on_a_testbed_instance_a_dying_service_fails_its_cell_and_is_restarted(
        testbed: Testbed, tmp_path: Path, cli: Cli) -> None:
    """Over SSH on tb-h2 (the FS read through tb-h1): the server listens inside tb-h2's network
    namespace, the trainer there reaches it on 127.0.0.1:{port}; killed mid-cell, the cell is
    service_down, the server comes back for the next cell, and status shows it all."""
    sweep, host, q = "svc", "tb-h2", "q2"
    proj = make_project(testbed, tmp_path, sweep, cells=2, epochs=1, step_time=0.2)
    work = testbed.shared_dir / "work" / sweep
    for helper in (svc_server, svc_train):
        shutil.copyfile(str(helper.__file__), work / Path(str(helper.__file__)).name)
    (work / "configs" / sweep / "c0.yaml").write_text(yaml.safe_dump(
        {"lr": 0.1, "hidden": 4, "seed": 0, "step_time": 0.5}))
    cfg = yaml.safe_load((proj / "ablate.yaml").read_text())
    cfg["tasks"]["recon"]["epochs"] = 30
    cfg["train"] = f"{sys.executable} svc_train.py --url http://127.0.0.1:{{port}}/ --out {{ckpt_dir}} -- " \
                   + TRAIN_IN_WORKDIR
    cfg["services"] = [{"name": "srv", "port": 9100, "ready": {"http": "http://127.0.0.1:{port}/health",
                                                               "timeout": 30},
                        "command": f"{sys.executable} svc_server.py --port {{port}} --ready-after 1 "
                                   f"--pidfile {testbed.shared_path}/work/{sweep}/svc.pid"}]
    (proj / "ablate.yaml").write_text(yaml.safe_dump(cfg))
    (proj / "queues").mkdir()
    (proj / "queues" / f"{q}.txt").write_text(
        f"# ablate: host={host}\nconfigs/{sweep}/c0.yaml recon\nconfigs/{sweep}/c1.yaml recon 1\n")
    try:
        assert cli(proj, "-q", "launch", q, "--host", host).code == 0
        wait_for(lambda: (testbed.local_dir(host) / "ckpt" / sweep / "c0" / "service.json").exists(),
                 timeout=60)
        row = cli.json(proj, "status")["queues"][0]
        assert row["services"]["srv"]["state"] == "ready" and row["services"]["srv"]["port"] == 9100
        first = int((work / "svc.pid").read_text())
        os.kill(first, signal.SIGKILL)  # one PID namespace: the instance's server is ours to kill

        def drained() -> list[dict[str, Any]] | None:
            evs = tb_events(testbed, sweep, host, q)
            return evs if evs and evs[-1]["ev"] == "queue_end" else None

        evs = wait_for(drained, timeout=90)
        assert isinstance(evs, list)
        assert [e["cell"] for e in evs if e["ev"] == "service_down"] == ["c0"]
        assert [e["ev"] for e in evs].count("service_start") == 2
        second = int((work / "svc.pid").read_text())
        c1 = json.loads((testbed.local_dir(host) / "ckpt" / sweep / "c1" / "service.json").read_text())
        assert c1["pid"] == second != first
        st = cli.json(proj, "status")
        assert st["cells"]["c0"]["state"] == "service_down" and st["cells"]["c1"]["state"] == "synced"
        assert st["queues"][0]["services"]["srv"]["state"] == "stopped"
        log = (testbed.local_dir(host) / "ckpt" / sweep / ".ablate-services" / f"{q}.srv.log").read_text()
        assert log.count("svc_server: listening on port 9100") == 2
    finally:
        close_all()
        shutil.rmtree(work, ignore_errors=True)
