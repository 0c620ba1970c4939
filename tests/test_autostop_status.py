"""Autostop as the controller sees it (issue 46's status side), in milliseconds: the probe reads the
watchers' files under `<root>/autostop/`; `status` says per host what autostop waits for, that a host
stopped itself (never idle_costing_money, never unreachable, its connect time-out not waited for) or
that its stop failed (still costing money); `ablate autostop` writes the control record the watcher
reads, atomically, and refuses bad input with nothing written. The sweeps are fabricated on a local
shared FS as the runner and the watcher write them; tmux is not there (unit tier): every host that
is asked does not answer."""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from typing import Any

import pytest
from rich.console import Console

from ablate.config.project import load_project
from ablate.monitor import hostinfo
from ablate.monitor.status import status
from ablate.monitor.watch import render
from ablate.remote.host import autostop_watch, probe
from ablate.sweep.ledger import prefix_sha256
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject

HOSTS = {"h1": {"speed": 1.0}, "h2": {"speed": 1.0}, "h3": {"speed": 1.0}}


def _ran(p: LocalProject, host: str, queue: str, *, launched: float, ended: float) -> None:
    """Queue `queue` ran one cell on `host` and drained: its ledger, events (the file's mtime at
    `ended`) and drained heartbeat, as the runner writes them."""
    cfg = p.cfg(f"cfgs/{queue}.yaml")
    lines = [f"# ablate: host={host}", f"{cfg} recon"]
    p.queue(queue, lines)
    root = p.shared
    for d in ("queues", "events", "heartbeats"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "queues" / f"{queue}.txt").write_text("".join(ln + "\n" for ln in lines))
    entry = {"t": launched, "host": host, "slot": None, "start_index": 0, "lines": 2,
             "prefix_sha256": prefix_sha256(lines), "spec": None, "run_queue": None, "op": "launch"}
    (root / "queues" / f"{queue}.ledger").write_text(json.dumps(entry) + "\n")
    events = [{"t": launched, "ev": "queue_start", "host": host, "queue": queue, "start_index": 0,
               "slot": None},
              {"t": ended, "ev": "queue_end", "host": host, "queue": queue, "idx": 2}]
    path = root / "events" / f"{host}.{queue}.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    os.utime(path, (ended, ended))
    hb = {"t": ended, "host": host, "queue": queue, "slot": None, "pid": 1, "pgid": 1, "state": "drained",
          "idx": 2, "cell": None, "cell_started": None}
    (root / "heartbeats" / f"{host}.{queue}").write_text(json.dumps(hb))
    os.utime(root / "heartbeats" / f"{host}.{queue}", (ended, ended))


def _state(p: LocalProject, host: str, kind: str, why: str, **fields: Any) -> None:
    """`autostop/<host>.state.json` as the watcher writes it, and its settings file (autostop on)."""
    d = p.shared / "autostop"
    d.mkdir(parents=True, exist_ok=True)
    rec = {"host": host, "kind": kind, "why": why, "t": time.time(), "every": 10.0, "idle": 600.0,
           "last_work": time.time() - 900, "stop_at": None, "stopped_at": None, "billed_idle": None,
           "stop_rc": None, "stop_out": None, "pid": 4242, **fields}
    (d / f"{host}.state.json").write_text(json.dumps(rec))
    (d / f"{host}.settings.json").write_text(json.dumps({"idle": 600, "command": "poweroff", "keep": 1}))


def _sweep(p: LocalProject) -> float:
    """h1 stopped itself 10 min ago (billed 6 min idle), h2's stop command failed, h3 stops in
    about 6 min (its record says 9: it was written 3 min ago; it checks every 2 min). Each ran a
    queue that drained an hour ago. Returns now."""
    p.write_config(hosts=HOSTS, monitor={"idle_after": "30m"}, steal=False)
    now = time.time()
    for i, host in enumerate(HOSTS, 1):
        _ran(p, host, f"q{i}", launched=now - 7200, ended=now - 3600)
    _state(p, "h1", "stopped", "stopped", stopped_at=now - 600, billed_idle=360.0, stop_rc=0, stop_out="")
    _state(p, "h2", "stop_failed", "the stop command failed: the instance keeps billing", stop_rc=1,
           stop_out="contacting the API\nerror: pod x7k2p9 not found\n")
    _state(p, "h3", "idle", "stops in 9 min", t=now - 180, every=120.0, stop_at=now + 330)
    return now


def test_the_probe_reads_the_watchers_records_and_which_hosts_have_autostop_on(
        local_project: LocalProject) -> None:
    p = local_project
    root = str(p.shared)
    empty = probe.snapshot({"root": root})
    assert (empty["autostop"], empty["autostop_on"], empty["autostop_control"]) == ({}, [], {})
    _sweep(p)
    d = p.shared / "autostop"
    control = {"cancelled": True, "idle": None, "t": 1.0, "by": "me@lap"}
    (d / "h1.control.json").write_text(json.dumps(control))
    (d / ".h3.state.json.77.tmp").write_text("{")  # a watcher's write in flight
    (d / "keepers.1.json").write_text(json.dumps({"hosts": ["h3"]}))  # the election's, not a host's
    (d / "h2.jsonl").write_text(json.dumps({"ev": "stop_failed"}) + "\n")
    got = probe.snapshot({"root": root})
    assert set(got["autostop"]) == {"h1", "h2", "h3"}
    assert got["autostop"]["h2"]["stop_rc"] == 1 and got["autostop"]["h3"]["kind"] == "idle"
    assert sorted(got["autostop_on"]) == ["h1", "h2", "h3"]
    assert got["autostop_control"] == {"h1": control}
    # `ablate autostop`'s own read: the same, the clock and the ledgers, nothing else
    small = probe.run("autostop", {"root": root})
    assert small["autostop"] == got["autostop"] and set(small["ledgers"]) == {"q1", "q2", "q3"}
    assert "events" not in small


def test_status_says_what_autostop_waits_for_and_which_host_stopped_itself(
        local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    now = _sweep(p)
    report = cli.json(p, "status")
    auto = report["autostop"]
    assert set(auto) == {"h1", "h2", "h3"}
    h1 = auto["h1"]
    assert h1["kind"] == "stopped" and h1["stopped"] is True and h1["billed_idle"] == 360.0
    assert abs(h1["stopped_at"] - (now - 600)) < 1 and h1["why"].endswith("billed 6 min idle")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(now - 600))
    assert h1["why"].startswith(f"stopped itself at {when}")
    # the idle host's stop time is recomputed from stop_at against the snapshot's clock, not copied
    assert auto["h3"]["why"] == "stops in 6 min" and auto["h3"]["stop_at"] == pytest.approx(now + 330)
    assert 175 < auto["h3"]["age"] < 240 and auto["h3"]["silent"] is False
    assert auto["h2"]["kind"] == "stop_failed" and auto["h2"]["stop_rc"] == 1
    assert "exited 1: error: pod x7k2p9 not found" in auto["h2"]["why"]
    # h1 is gone on purpose: neither unreachable nor idle and costing money; h2 bills on
    assert "h1" not in report["unreachable"] and {"h2", "h3"} <= set(report["unreachable"])
    assert report["hosts"]["h1"]["error"] == "stopped (autostop)"
    idle = {a["host"]: a for a in report["idle_hosts"]}
    assert set(idle) == {"h2", "h3"}  # h3: an hour idle, over idle_after; h1 never listed
    assert idle["h2"]["state"] == "idle_costing_money" and "pod x7k2p9 not found" in idle["h2"]["stop_failed"]
    assert idle["h3"]["stop_failed"] is None
    # the existing keys are all still there
    assert {"queues", "cells", "idle_hosts", "hosts", "unreachable", "views", "states"} <= set(report)

    text = cli(p, "status").out
    assert "host h1 stopped (autostop): stopped itself at" in text and "billed 6 min idle" in text
    assert "host h1 unreachable" not in text and "host h1 idle_costing_money" not in text
    assert "host h3 autostop: stops in 6 min" in text
    assert "host h2 idle_costing_money" in text
    assert "autostop could not stop it: its stop command exited 1" in text


def test_a_failed_stop_is_costing_money_before_idle_after(local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    _sweep(p)
    p.write_config(hosts=HOSTS, monitor={"idle_after": "5h"}, steal=False)  # nobody idle long enough
    idle = {a["host"]: a["state"] for a in cli.json(p, "status")["idle_hosts"]}
    assert idle == {"h2": "idle_costing_money"}


def test_a_host_launched_on_after_it_stopped_itself_is_no_longer_known_stopped(
        local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    now = _sweep(p)
    _ran(p, "h1", "q4", launched=now - 300, ended=now - 3000)  # launched 5 min ago, after the stop
    report = cli.json(p, "status")
    assert report["autostop"]["h1"]["stopped"] is False
    assert "a queue was launched on it since" in report["autostop"]["h1"]["why"]
    assert "h1" in report["unreachable"] and report["hosts"]["h1"]["error"] != "stopped (autostop)"


def test_a_silent_watcher_is_named(local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    now = _sweep(p)
    _state(p, "h3", "running", "running cells: q3", t=now - 45)  # every 10 s: 4.5 checks missed
    _state(p, "h1", "stopped", "stopped", t=now - 3600, stopped_at=now - 3600, billed_idle=60.0)
    auto = cli.json(p, "status")["autostop"]
    assert auto["h3"]["silent"] is True
    assert auto["h3"]["why"].startswith("its watcher is silent: no check for 4")
    assert auto["h3"]["why"].endswith("it last said: running cells: q3")
    assert auto["h1"]["silent"] is False  # a stopped host's watcher is gone with it
    _state(p, "h3", "running", "running cells: q3", t=now - 25)  # 2.5 checks: not yet
    assert cli.json(p, "status")["autostop"]["h3"]["silent"] is False


def test_status_does_not_wait_for_a_host_that_stopped_itself(
        local_project: LocalProject, monkeypatch: pytest.MonkeyPatch) -> None:
    """h1's query hangs as a connect to a powered-off instance does; the probe says h1 stopped
    itself, so status answers without it."""
    p = local_project
    _sweep(p)
    release = threading.Event()
    real = hostinfo.host_live

    def slow(project: Any, host: str, *args: Any, **kwargs: Any) -> hostinfo.HostLive:
        if host == "h1":
            release.wait(20)
        return real(project, host, *args, **kwargs)

    monkeypatch.setattr(hostinfo, "host_live", slow)
    try:
        t0 = time.monotonic()
        report = status(load_project(p.root), live_info=True)
        assert time.monotonic() - t0 < 10
        assert report.autostop["h1"].stopped and "h1" not in report.unreachable
        assert report.hosts["h1"]["error"] == "stopped (autostop)"
        # asked again while that query is still out (the dashboard's next refresh): not asked twice
        asked = hostinfo.ask_each(load_project(p.root))
        again = hostinfo.ask_each(load_project(p.root))
        assert asked["h1"] is again["h1"] and not asked["h1"].done()
    finally:
        release.set()


def test_the_dashboard_shows_a_stopped_host_and_what_autostop_waits_for(local_project: LocalProject) -> None:
    p = local_project
    _sweep(p)
    report = status(load_project(p.root), live_info=True)
    console = Console(record=True, width=200, no_color=True)
    console.print(render(report))
    text = console.export_text()
    h1 = next(ln for ln in text.splitlines() if ln.startswith("h1 "))
    assert re.match(r"h1\s+stopped \(autostop\)\s+stopped itself at .*, billed 6 min idle$", h1.rstrip()), h1
    h3 = next(ln for ln in text.splitlines() if ln.startswith("h3 "))
    assert "autostop: stops in 6 min" in h3
    h2 = next(ln for ln in text.splitlines() if ln.startswith("h2 "))
    assert "exited 1" in h2


# --------------------------------------------------------------------------- ablate autostop


def _control(p: LocalProject, host: str) -> dict[str, Any] | None:
    path = p.shared / "autostop" / f"{host}.control.json"
    return json.loads(path.read_text()) if path.exists() else None


def _on(p: LocalProject, *hosts: str) -> None:
    p.write_config(hosts=HOSTS)
    d = p.shared / "autostop"
    d.mkdir(parents=True, exist_ok=True)
    for h in hosts:
        (d / f"{h}.settings.json").write_text(json.dumps({"idle": 600, "command": "poweroff", "keep": 1}))


def test_autostop_cancel_writes_every_on_hosts_control_that_the_watcher_reads(
        local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    _on(p, "h1", "h2")
    got = cli.json(p, "autostop", "--cancel")
    assert set(got["changed"]) == {"h1", "h2"} and _control(p, "h3") is None
    rec = _control(p, "h1")
    assert rec is not None and rec["cancelled"] is True and rec["idle"] is None
    assert set(rec) == {"cancelled", "idle", "t", "by"} and "@" in rec["by"]
    assert abs(rec["t"] - time.time()) < 60
    assert got["hosts"]["h1"]["control"]["cancelled"] is True
    assert not [n for n in os.listdir(p.shared / "autostop") if n.startswith(".")]  # no temp file left
    cfg = autostop_watch.read_config(str(p.shared), "h1")
    assert cfg is not None and cfg.cancelled

    # --idle alone resumes it, with its own idle
    r = cli(p, "autostop", "--idle", "20s", "--host", "h1")
    assert r.code == 0 and "h1: autostop idle set to 20s" in r.out
    assert _control(p, "h1") == {**(_control(p, "h1") or {}), "cancelled": False, "idle": 20.0}
    assert _control(p, "h2") == {**(_control(p, "h2") or {}), "cancelled": True}  # untouched
    cfg = autostop_watch.read_config(str(p.shared), "h1")
    assert cfg is not None and not cfg.cancelled and cfg.settings.idle == 20.0

    # both: cancelled, the idle recorded
    cli.json(p, "autostop", "--cancel", "--idle", "10m", "--host", "h2,h1")
    assert {h: (_control(p, h) or {}).get("idle") for h in ("h1", "h2")} == {"h1": 600.0, "h2": 600.0}
    assert all((_control(p, h) or {}).get("cancelled") for h in ("h1", "h2"))


def test_autostop_alone_shows_each_hosts_state(local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    _sweep(p)
    got = cli.json(p, "autostop")
    assert got["changed"] == {}
    assert {h: a["kind"] for h, a in got["hosts"].items()} == {"h1": "stopped", "h2": "stop_failed",
                                                                 "h3": "idle"}
    assert got["hosts"]["h3"]["why"] == "stops in 6 min"
    r = cli(p, "autostop", "--host", "h1")
    assert r.code == 0 and r.out.startswith("h1: stopped itself at") and "h2" not in r.out


@pytest.mark.parametrize(("args", "says"), [
    (("--idle", "ten minutes"), "--idle: expected a duration"),
    (("--idle", "-5m", "--host", "h1"), "--idle: expected a duration"),
    (("--cancel", "--host", "h9"), "unknown host 'h9'"),
    (("--idle", "5m", "--host", "h1,h9"), "unknown host 'h9'"),
    (("--idle", "5m", "--host", "h1", "--host", "h9"), "unknown host 'h9'"),
    (("--cancel", "--host", ""), "expected host names"),
])
def test_autostop_refuses_bad_input_and_writes_nothing(local_project: LocalProject, cli: Cli,
                                                       args: tuple[str, ...], says: str) -> None:
    p = local_project
    _on(p, "h1")
    before = p.snapshot()
    r = cli(p, "autostop", *args)
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1
    assert p.snapshot() == before
    assert cli(p, "autostop", *args, "--json").json()["error"]


def test_autostop_with_no_host_on_and_none_named_is_refused(local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    p.write_config(hosts=HOSTS)
    r = cli(p, "autostop", "--cancel")
    assert r.code == 2 and "autostop is on for no host" in r.err
    assert not (p.shared / "autostop").exists() or not list((p.shared / "autostop").glob("*.control.json"))
    # a host named explicitly gets its record before autostop is on there (a launch turns it on)
    r = cli(p, "autostop", "--cancel", "--host", "h2")
    assert r.code == 0 and "recorded for when it is" in r.out
    assert (_control(p, "h2") or {}).get("cancelled") is True


def test_autostop_waits_for_another_controller_and_writes_nothing_meanwhile(
        local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    _on(p, "h1")
    lock = p.shared / "locks" / "controller.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:  # another controller's flock(2) on the sweep's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        r = cli(p, "--lock-timeout", "0.2", "autostop", "--cancel")
        assert r.code == 1 and "is busy" in r.err and _control(p, "h1") is None
        assert cli(p, "--lock-timeout", "0.2", "autostop").code == 0  # showing takes no lock
    cli.json(p, "autostop", "--cancel")
    assert (_control(p, "h1") or {}).get("cancelled") is True


def test_a_stopping_record_whose_watcher_went_silent_is_a_stopped_host() -> None:
    """The stop command took the instance, and its watcher, before the watcher could write
    `stopped`: once silent, its `stopping` record means stopped."""
    from ablate.sweep import autostop_view

    rec = {"kind": "stopping", "why": "idle 1 min since its last work: stopping", "t": 1000.0, "every": 10,
           "stopped_at": 1000.0, "billed_idle": 61.0}
    doc = {"autostop": {"h1": rec}, "autostop_on": ["h1"]}
    fresh = autostop_view.read(1005.0, doc, {})["h1"]
    assert not fresh.stopped and fresh.why().startswith("idle 1 min")
    gone = autostop_view.read(1031.0, doc, {})["h1"]
    assert gone.stopped and gone.why().startswith("stopped itself at") and "billed 2 min idle" in gone.why()
    later = {"q1": [{"op": "launch", "host": "h1", "t": 1100.0, "start_index": 0}]}
    assert not autostop_view.read(1200.0, doc, later)["h1"].stopped  # launched on since


def test_every_command_reading_the_sweep_skips_a_host_that_stopped_itself(
        local_project: LocalProject, monkeypatch: pytest.MonkeyPatch) -> None:
    """remediate, reconcile and the rest read the sweep through `snapshot.load`: h1's query hangs
    as a connect to a powered-off instance does; the probe says h1 stopped itself, so the state is
    built without it, h1 unreachable for that reason (remediate plans only the live hosts)."""
    from ablate.sweep import hostview, snapshot

    p = local_project
    _sweep(p)
    release = threading.Event()
    real = hostview.ask_one

    def slow(project: Any, host: str) -> Any:
        if host == "h1":
            release.wait(20)
        return real(project, host)

    monkeypatch.setattr(hostview, "ask_one", slow)
    try:
        t0 = time.monotonic()
        state = snapshot.load(load_project(p.root))
        assert time.monotonic() - t0 < 10
        assert not state.reachable("h1") and state.unreachable["h1"] == "stopped itself (autostop)"
        assert state.unreachable.get("h2") != "stopped itself (autostop)"  # asked (no tmux in this tier)
    finally:
        release.set()


def test_launch_all_does_not_wait_for_a_host_that_stopped_itself(
        local_project: LocalProject, monkeypatch: pytest.MonkeyPatch) -> None:
    """`launch --all` plans only the live hosts: h1's queue is reported at once, not launched, with
    what to do; h1 itself is never waited for (its ask hangs as a connect to a powered-off box)."""
    from ablate.run import pipeline
    from ablate.run.launch import launch_all

    p = local_project
    _sweep(p)
    for q in ("q2", "q3"):  # only h1's queue is planned
        (p.root / "queues" / f"{q}.txt").unlink()
    release = threading.Event()
    real = pipeline._ask

    def slow(ctx: Any, host: Any) -> Any:
        if host.name == "h1":
            release.wait(20)
        return real(ctx, host)

    monkeypatch.setattr(pipeline, "_ask", slow)
    try:
        t0 = time.monotonic()
        [got] = launch_all(load_project(p.root))
        assert time.monotonic() - t0 < 10
        assert got.status == "failed" and "h1 stopped itself at" in str(got.error), got
        assert "`ablate launch QUEUE --host h1`" in str(got.error)
    finally:
        release.set()
