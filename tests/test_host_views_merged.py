"""Each host's own view merged over the FS host's snapshot (ablate/sweep/views.py), and absence
never taken on a view that may be stale (SweepState.unsettled, classify's `unconfirmed`). The
merge rules on the probe's documents; the rules on a real local sweep's snapshot, as a controller
on a caching FS would see it with a host that does or does not answer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.remote.host import probe
from ablate.remote.layout import SweepLayout, session_name
from ablate.sweep.classify import cfg_hashes, classify
from ablate.sweep.hostview import ask_split, split_view
from ablate.sweep.snapshot import Snapshot, SweepState, all_queues, stale_after
from ablate.sweep.views import DEFAULT_LAG, FsLag, merge_views
from ablate.transport.local import LocalFS
from ablate.transport.shellhost import ShellHost
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.testbed_projects import events, make_project
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for
from tests.testbed import Testbed


def ev(ev: str, cell: str | None = None, **kw: Any) -> dict[str, Any]:
    return {"ev": ev, **({"cell": cell} if cell else {}), **kw}


FS = {  # what the FS host sees: h2's events file without its last lines, an old heartbeat
    "now": 1000.0,
    "events": {"h2.q2": [ev("start", "a", idx=0)]},
    "events_mtime": {"h2.q2": 900.0},
    "heartbeats": {"h2.q2": {"mtime": 900.0, "data": {"host": "h2", "queue": "q2", "state": "running"}}},
    "claims": {"a": "h2 q2 0 899.0", "old": ""},
    "final": [], "manifests": {}, "partial": ["a"], "tails": {},
    "released": {"gone": ["gone.950.000"]}, "aside": [".aside.redo.960.000"],
}
MINE = {  # what h2 sees of its own writes
    "host": "h2",
    "events": {"h2.q2": [ev("start", "a", idx=0), ev("end", "a", rc=0), ev("queue_end")]},
    "events_mtime": {"h2.q2": 990.0},
    "heartbeats": {"h2.q2": {"mtime": 990.0, "data": {"host": "h2", "queue": "q2", "state": "drained"}}},
    "claims": {"a": "h2 q2 0 899.0", "old": "h2 q2 1 905.0", "gone": "h2 q2 2 940.0", "new": "h2 q2 3 980.0"},
    "final": ["a", "redo"],
    "manifests": {"a": {"sha256": "x", "valid": True, "mtime": 985.0},
                  "redo": {"sha256": "y", "valid": True, "mtime": 955.0}},
    "partial": [], "tails": {},
}


def test_the_writers_view_wins_where_it_is_newer_and_removals_are_not_undone() -> None:
    got = merge_views(FS, {"h2": MINE})
    assert [e["ev"] for e in got["events"]["h2.q2"]] == ["start", "end", "queue_end"]  # the longer
    assert got["events_mtime"]["h2.q2"] == 990.0
    assert got["heartbeats"]["h2.q2"]["data"]["state"] == "drained"  # the later mtime
    # A claim the FS host cannot see yet counts; one released since (its t before the release) not.
    assert got["claims"]["new"] == "h2 q2 3 980.0" and "gone" not in got["claims"]
    assert got["claims"]["old"] == "h2 q2 1 905.0"  # an owner the FS host had not seen yet
    # A published result the FS host cannot see counts and is no longer partial; one set aside
    # by remediate after it was made (the writer's cache still shows it) does not come back.
    assert got["final"] == ["a"] and got["partial"] == [] and "redo" not in got["manifests"]
    # Nothing the writer did not write is touched.
    assert got["released"] == FS["released"] and got["now"] == 1000.0


def test_an_older_or_shorter_view_never_replaces_a_newer_one() -> None:
    stale_mine = {**MINE, "events": {"h2.q2": []}, "heartbeats": {"h2.q2": {"mtime": 10.0, "data": {}}}}
    got = merge_views(FS, {"h2": stale_mine})
    assert got["events"]["h2.q2"] == FS["events"]["h2.q2"]
    assert got["heartbeats"]["h2.q2"]["mtime"] == 900.0


def test_the_lag_allowed_is_the_measured_one_with_a_margin_else_a_conservative_default() -> None:
    assert FsLag.from_record({"lag": 20.0}).seconds == 30.0
    assert FsLag.from_record({"lag": 0.0}).seconds == 2.0
    assert FsLag.from_record(None).seconds == DEFAULT_LAG and "not measured" in FsLag.from_record(None).note
    assert FsLag.from_record({"lag": "soon"}).seconds == DEFAULT_LAG


@pytest.fixture
def ran(local_project: LocalProject, cli: Cli) -> tuple[LocalProject, dict[str, Any]]:
    """A real queue run to its end on h1 (h2 has a queue never reached): the FS's truth."""
    require_tmux()
    p = local_project
    p.write_config(steal=False)
    p.queue("q1", ["# ablate: host=h1", p.cfg("cfgs/a/one.yaml") + " recon 1"])
    p.queue("q2", ["# ablate: host=h2", p.cfg("cfgs/a/two.yaml") + " recon 1"])
    cli.json(p, "launch", "q1", "--host", "h1")
    wait_for(lambda: '"queue_end"' in (p.shared / "events" / "h1.q1.jsonl").read_text()
             if (p.shared / "events" / "h1.q1.jsonl").exists() else False, timeout=60, interval=0.1)
    return p, LocalFS(str(p.shared)).probe("snapshot", {"root": str(p.shared)})


def _state(p: LocalProject, raw: dict[str, Any], confirmed: set[str], lag: float) -> SweepState:
    project = load_project(p.root)
    snap = Snapshot.parse(raw)
    queues, _ = all_queues(project, snap.queue_copies)
    return SweepState(snap, {"h1": None, "h2": set()}, sweep=project.sweep, stale_after=stale_after(project),
                      queues=queues, confirmed=confirmed, lag=FsLag(lag, "test"))


def _cells(p: LocalProject, st: SweepState) -> dict[str, Any]:
    project = load_project(p.root)
    return classify(st, cfg_sha=cfg_hashes(project, st.queues), verification=None, hung_after=1800)


@pytest.mark.tmux
def test_absence_on_a_view_that_may_be_stale_is_unconfirmed_until_the_lag_has_passed(
        ran: tuple[LocalProject, dict[str, Any]]) -> None:
    p, raw = ran
    # h1 does not answer and its files were read through another host: what h1 may have written
    # in the last stale_after + lag is possibly invisible, so "h1 never ran `two`"... is not known.
    raw = {**raw, "events": {}, "events_mtime": {k: v for k, v in raw["events_mtime"].items()},
           "claims": {}, "final": [], "manifests": {}}
    st = _state(p, raw, confirmed={"h2"}, lag=20.0)
    assert "h1" in st.unsettled() and "20 s" in st.unsettled()["h1"]
    one = _cells(p, st)["one"]
    assert one.state == "never_ran" and one.unconfirmed and "h1" in one.unconfirmed
    # The same view once the lag has passed since h1's last sign of life: a fact.
    later = _state(p, {**raw, "now": raw["now"] + stale_after(load_project(p.root)) + 21}, {"h2"}, 20.0)
    assert later.unsettled() == {} and _cells(p, later)["one"].unconfirmed is None
    # Read through h1 itself (confirmed): a fact at once.
    mine = _state(p, raw, confirmed={"h1", "h2"}, lag=20.0)
    assert mine.unsettled() == {} and _cells(p, mine)["one"].unconfirmed is None


@pytest.mark.tmux
def test_an_unreachable_hosts_heartbeat_is_fresh_for_the_lag_longer(
        ran: tuple[LocalProject, dict[str, Any]]) -> None:
    p, raw = ran
    hb = dict(raw["heartbeats"]["h1.q1"])
    hb["data"] = {**hb["data"], "state": "running"}
    raw = {**raw, "heartbeats": {"h1.q1": hb}, "now": hb["mtime"] + 40}  # 40 s old: past stale_after
    assert not _state(p, raw, confirmed={"h1", "h2"}, lag=20.0).fresh("h1", "q1")
    st = _state(p, raw, confirmed={"h2"}, lag=20.0)  # through a cache: it may be 20 s newer
    assert st.fresh("h1", "q1") and st.live("h1", "q1") and st.lost_hosts() == {}
    assert session_name("t1", "h1", "q1")  # (the session it stands for, when h1 answers)


def test_on_sshfs_a_queue_that_just_drained_is_read_through_its_own_host(
        testbed_sshfs: Testbed, tmp_path: Path, cli: Cli) -> None:
    """The failure users met, on a real network FS: a queue on tb-h2 drains while the FS host
    (tb-h1) still holds cached listings without its claim, events file and result. Read through
    tb-h2, the cell is synced at once (never `never_ran`), reconcile --fs verifies it (its name
    looked up by exact path), and remediate has nothing to re-run."""
    tb, sweep = testbed_sshfs, "views1"
    proj = make_project(tb, tmp_path, sweep, cells=1, epochs=1, step_time=0.0)
    (proj / "queues").mkdir(exist_ok=True)
    (proj / "queues" / "q2.txt").write_text(f"# ablate: host=tb-h2\nconfigs/{sweep}/c0.yaml recon\n")
    cli.json(proj, "deploy")
    mnt = f"{tb.shared_path}/ablate/{sweep}"
    for d in ("claims", "final_ckpts", "events", "heartbeats"):
        (tb.shared_dir / "ablate" / sweep / d).mkdir(exist_ok=True)
    assert cli.json(proj, "status")["cells"]["c0"]["state"] == "never_ran"  # tb-h1 listed them: cached
    cli.json(proj, "launch", "q2", "--host", "tb-h2")
    wait_for(lambda: any(e["ev"] == "queue_end" for e in events(tb, sweep, "tb-h2", "q2")), timeout=30,
             interval=0.1)
    seen = subprocess.run(tb.ssh_argv("tb-h1", "ls", f"{mnt}/claims", f"{mnt}/final_ckpts", f"{mnt}/events"),
                          capture_output=True, text=True, timeout=30).stdout
    # The entries `ls` lists (not its headers: the bed's path holds a random hex id, e.g. 7c0755).
    entries = [line for line in seen.splitlines() if line and not line.endswith(":")]
    assert not any("c0" in e or "q2" in e for e in entries), seen  # the FS host's view: as if it never ran

    st = cli.json(proj, "status")
    assert st["cells"]["c0"]["state"] == "synced" and "unconfirmed" not in st["cells"]["c0"], st["cells"]
    assert st["views"]["tb-h2"]["through"] == "tb-h2" and st["views"]["tb-h2"]["max_age"] == 0
    assert [q["state"] for q in st["queues"]] == ["drained"]
    rec = cli.json(proj, "reconcile", "--fs")
    assert rec["complete"] is True and rec["verified"] == 1, rec
    assert cli.json(proj, "remediate")["targets"] == {}


class _Recorder(ShellHost):
    """A host whose agent answers (`agent_ready`), recording the requests it gets."""

    name, tmux_socket = "rec", None

    def __init__(self) -> None:
        self.log: list[str] = []
        self.sent: list[Any] = []

    def agent_ready(self) -> bool:
        return True

    def exec(self, command: str, *, timeout: float = 60.0, stdin: bytes | None = None,
             sink: Any = None, py: Any = None) -> tuple[int, bytes, bytes]:
        self.log.append("view" if py is not None else "script")
        self.sent.append(py)
        if py is None:
            return 0, b"out", b""
        return 0, json.dumps({"host": "rec", "tmux": {"out": "s1\ns2\n", "rc": 0}}).encode(), b""

    def open_live(self, command: str, *, timeout: float = 60.0) -> Any:
        raise AssertionError("not used")

    def target(self) -> str:
        return "rec"


def test_where_the_agent_answers_tmux_and_the_view_go_in_one_request_tmux_first(tmp_path: Path) -> None:
    """A queue writes its `end` before its session ends: a view read before tmux answered could miss
    the end of a queue tmux no longer lists, and the cell would be taken for interrupted. The probe
    asks tmux first: here a tmux that ends a queue as it answers, and the view holds that end."""
    host = _Recorder()
    args = ["/lib", "", "python3", json.dumps({"root": "/r", "host": "rec"})]
    tmux, view, live = ask_split(host, args, 10.0)
    assert host.log == ["view"] and tmux == ({"s1", "s2"}, None) and view == ({"host": "rec"}, None)
    assert live is None
    assert json.loads(host.sent[0]["argv"][1]) == {"root": "/r", "host": "rec", "tmux": ["tmux"]}

    lay = SweepLayout(str(tmp_path / "sweep"))
    os.makedirs(lay.events)
    fake = tmp_path / "tmux"
    fake.write_text(f"#!/bin/sh\necho '{{\"ev\": \"queue_end\"}}' >> {lay.events}/rec.q1.jsonl\necho other\n")
    fake.chmod(0o755)
    doc = probe.mine({"root": lay.root, "host": "rec", "tmux": [str(fake)]})
    assert doc["tmux"] == {"out": "other\n", "rc": 0}
    assert doc["events"] == {"rec.q1": [{"ev": "queue_end"}]}
    missing = probe.mine({"root": lay.root, "host": "rec", "tmux": [str(tmp_path / "none")]})
    assert missing["tmux"]["rc"] == 127


class _FirstContact(_Recorder):
    """A host no agent serves yet, whose next command starts one (or never will: `boots`)."""

    def __init__(self, boots: bool) -> None:
        super().__init__()
        self.boots, self.up = boots, False

    def agent_ready(self) -> bool:
        return self.up

    def agent_on_first(self) -> bool:
        return self.boots and not self.up

    def exec(self, command: str, *, timeout: float = 60.0, stdin: bytes | None = None,
             sink: Any = None, py: Any = None) -> tuple[int, bytes, bytes]:
        if py is None and command == "true":
            self.log.append("true")
            self.up = self.boots
            return 0, b"", b""
        assert py is not None, command  # nothing else goes to the host here
        return super().exec(command, timeout=timeout, stdin=stdin, sink=sink, py=py)


@pytest.mark.parametrize("boots", [True, False])
def test_at_first_contact_a_true_starts_the_agent_and_the_probe_goes_to_it(boots: bool) -> None:
    """Where this command starts a host's agent, `true` takes the one login shell and tmux and the
    view go to the agent as one probe (no Python started for the view); where none can start, the
    host's one script, as before."""
    host = _FirstContact(boots)
    args = ["/lib", "", "python3", json.dumps({"root": "/r", "host": "rec"})]
    assert split_view(host, args) is boots
    assert host.log == (["true"] if boots else [])
    if boots:
        assert ask_split(host, args, 10.0)[0] == ({"s1", "s2"}, None) and host.log == ["true", "view"]
    assert split_view(_FirstContact(True), ["", "", "", ""]) is False  # no view to ask (local)
