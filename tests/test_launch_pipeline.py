"""`launch` and `launch --all` are one pipeline fed by one snapshot: the same ledger entries and the
same `run_queue` command line from both, the same resume index, the same refusals, and one shared-FS
snapshot plus one command per involved host before anything starts, a few batches of FS writes
and one tmux start command per host. Real tmux (the conftest's private
socket), the real tiny trainer, real files."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from ablate.config.project import load_project
from ablate.errors import AblateError, CheckFailed
from ablate.remote.layout import session_name
from ablate.run.launch import launch, launch_all
from ablate.run.stop import stop
from ablate.transport.local import LocalFS, LocalHost

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py


class Proj(Protocol):  # the conftest's LocalProject, as used here
    root: Path

    @property
    def shared(self) -> Path: ...
    def write_config(self, **overrides: object) -> Path: ...
    def cfg(self, rel: str, **values: object) -> str: ...
    def queue(self, name: str, lines: list[str]) -> Path: ...
    def snapshot(self) -> dict[str, bytes]: ...


@pytest.fixture(autouse=True)
def _tmux() -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed; the README's test command installs it")


def wait(cond: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.05)


def events(lp: Proj, host: str, queue: str) -> list[dict[str, Any]]:
    path = lp.shared / "events" / f"{host}.{queue}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def live(host: str, queue: str) -> bool:
    return session_name("t1", host, queue) in LocalHost(host).tmux_sessions()


def wait_drained(lp: Proj, host: str, queue: str, ends: int) -> None:
    """Until the queue's tmux session is gone after its `ends`-th `queue_end`."""
    wait(lambda: not live(host, queue)
         and sum(e["ev"] == "queue_end" for e in events(lp, host, queue)) >= ends)


def ledger(lp: Proj, queue: str) -> list[dict[str, Any]]:
    """The queue's ledger entries without their time stamps."""
    lines = (lp.shared / "queues" / f"{queue}.ledger").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "t"} for x in lines]


def start_commands() -> dict[str, list[str]]:
    """session -> the queue's argv tmux started its pane with (what launch handed it, after the
    step that loads the launching connection's environment, `bash -c LOAD ablate-env FILE`, whose
    FILE differs per start; tmux may show the command line quoted as one word)."""
    p = subprocess.run(["tmux", "-L", os.environ["ABLATE_TMUX_SOCKET"], "list-panes", "-a", "-F",
                        "#{session_name}\t#{pane_start_command}"], capture_output=True, text=True)
    out = {}
    for ln in p.stdout.splitlines():
        session, _, cmd = ln.partition("\t")
        words = shlex.split(cmd)
        words = shlex.split(words[0]) if len(words) == 1 else words
        assert words[:2] == ["bash", "-c"] and words[3] == "ablate-env", words
        out[session] = words[5:]
    return out


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts, at the transport's edge, the shared-FS snapshots (`probe snapshot`), batches of FS
    ops (`apply`) and other FS reads, each host's commands (`ask`: its tmux sessions with the
    budget and drift checks; `start`: tmux sessions started) and its lone tmux queries."""
    calls: Counter[str] = Counter()
    probe, apply, read = LocalFS.probe, LocalFS.apply, LocalFS.read_bytes
    run, sessions = LocalHost.run, LocalHost.tmux_sessions

    def counting_probe(self: LocalFS, op: str, args: Any) -> Any:
        calls[f"probe {op}"] += 1
        return probe(self, op, args)

    def counting_apply(self: LocalFS, ops: Any) -> Any:
        calls["apply"] += 1
        return apply(self, ops)

    def counting_read(self: LocalFS, path: str) -> bytes | None:
        calls["read_bytes"] += 1
        return read(self, path)

    def counting_run(self: LocalHost, argv: Any, **kw: Any) -> Any:
        script = " ".join(argv)
        what = "start" if "new-session" in script else "ask" if "list-sessions" in script else "run"
        calls[f"{what} {self.name}"] += 1
        return run(self, argv, **kw)

    def counting_sessions(self: LocalHost) -> set[str]:
        calls[f"tmux {self.name}"] += 1
        return sessions(self)

    monkeypatch.setattr(LocalFS, "probe", counting_probe)
    monkeypatch.setattr(LocalFS, "apply", counting_apply)
    monkeypatch.setattr(LocalFS, "read_bytes", counting_read)
    monkeypatch.setattr(LocalHost, "run", counting_run)
    monkeypatch.setattr(LocalHost, "tmux_sessions", counting_sessions)
    yield calls


def two_slow_queues(lp: Proj) -> None:
    """q1 on h1 and q2 on h2, each a long cell first (so the queue stays live: 10 min, resumed across
    the relaunches, however slow the machine), then a quick one."""
    for q, h in (("q1", "h1"), ("q2", "h2")):
        lp.queue(q, [f"# ablate: host={h}", lp.cfg(f"cfgs/{q}/{q}long.yaml", step_time=0.2) + " recon 3000",
                     lp.cfg(f"cfgs/{q}/{q}quick.yaml") + " recon 1"])


# --------------------------------------------------------------------------- one pipeline


def test_launch_and_launch_all_record_the_same_entries_and_the_same_argv(local_project: Proj) -> None:
    lp = local_project
    two_slow_queues(lp)
    project = load_project(lp.root)
    first = [launch(project, "q1", "h1"), launch(project, "q2", "h2")]  # a first launch: line 0
    assert [(r.status, r.start_index, r.resumed) for r in first] == [("launched", 0, False)] * 2

    runs: list[tuple[list[dict[str, Any]], dict[str, list[str]], list[dict[str, Any]]]] = []
    for how in ("launch --all", "launch"):
        for q, h in (("q1", "h1"), ("q2", "h2")):
            stop(project, q, h)  # the long cell is cut: no durable result, its claim kept
        assert not start_commands()
        if how == "launch --all":
            results = launch_all(project)
        else:
            results = [launch(project, "q1", "h1"), launch(project, "q2", "h2")]
        runs.append(([r.to_json() for r in results], start_commands(),
                     [ledger(lp, "q1")[-1], ledger(lp, "q2")[-1]]))
    (all_results, all_argv, all_entries), (one_results, one_argv, one_entries) = runs
    assert all_results == one_results and all_argv == one_argv and all_entries == one_entries
    assert [(r["status"], r["start_index"], r["resumed"], r["cells"]) for r in all_results] == [
        ("launched", 1, True, 2)] * 2  # the first unfinished cell (line 0 is the header)
    assert [(e["host"], e["start_index"], e["lines"], e["op"]) for e in all_entries] == [
        ("h1", 1, 3, "launch"), ("h2", 1, 3, "launch")]
    assert all_entries[0]["prefix_sha256"] == ledger(lp, "q1")[0]["prefix_sha256"]
    wrappers, specs = lp.shared / "wrappers", lp.shared / "specs"
    for r in all_results:
        assert all_argv[r["session"]] == [
            "bash", str(wrappers / r["run_queue"]), str(specs / r["spec"]), r["queue"], "1"]
    for q, h in (("q1", "h1"), ("q2", "h2")):
        stop(project, q, h)


def test_relaunch_of_a_drained_queue_resumes_at_the_first_unfinished_cell_in_both(
        local_project: Proj) -> None:
    lp = local_project
    lp.queue("q1", ["# ablate: host=h1", lp.cfg("cfgs/a/ok1.yaml") + " recon 1",
                    lp.cfg("cfgs/a/crash.yaml", exit_code=1) + " recon 1",
                    lp.cfg("cfgs/a/ok2.yaml") + " recon 1"])
    project = load_project(lp.root)
    assert launch(project, "q1", "h1").start_index == 0
    wait_drained(lp, "h1", "q1", 1)
    assert sorted(p.name for p in (lp.shared / "final_ckpts").iterdir()) == ["ok1", "ok2"]

    single = launch(project, "q1", "h1")
    assert (single.status, single.start_index, single.resumed, single.cells) == ("launched", 2, True, 2)
    wait_drained(lp, "h1", "q1", 2)
    [every] = launch_all(project)
    assert every.to_json() == single.to_json()
    wait_drained(lp, "h1", "q1", 3)
    entries = ledger(lp, "q1")
    assert [e["start_index"] for e in entries] == [0, 2, 2] and entries[1] == entries[2]
    starts = [(e["cell"], e["resume"]) for e in events(lp, "h1", "q1") if e["ev"] == "start"]
    # the relaunches start at the crashed cell, and pass it over: it ended, a re-run is remediate's
    assert starts == [("ok1", 0), ("crash", 0), ("ok2", 0)]


def test_a_budget_refusal_changes_nothing_and_launch_all_starts_the_other_hosts(
        local_project: Proj, tmux_socket: str) -> None:
    lp = local_project
    free = shutil.disk_usage(lp.root).free
    # 0.05 of the free space per checkpoint and 0.9 of it scratch: h2's one cell fits, h1's four do
    # not; the shared FS (the same disk here) holds the five results and the copies (0.55 of it).
    lp.write_config(budget={"ckpt_size": int(free * 0.05), "scratch": int(free * 0.9)})
    lp.queue("q1", ["# ablate: host=h1", *(lp.cfg(f"cfgs/a/b{i}.yaml") + " recon 1" for i in range(4))])
    lp.queue("q2", ["# ablate: host=h2", lp.cfg("cfgs/b/fits.yaml") + " recon 1"])
    project = load_project(lp.root)
    before = lp.snapshot()
    with pytest.raises(CheckFailed) as e:
        launch(project, "q1", "h1")
    assert e.value.exit_code == 1
    assert e.value.message.startswith("h1: disk below budget: need") and "(4 cell(s) x" in e.value.message
    assert lp.snapshot() == before  # nothing deployed, no queue copy, no ledger, no estimates
    assert subprocess.run(["tmux", "-L", tmux_socket, "has-session"], capture_output=True).returncode != 0

    results = launch_all(project)
    assert [(r.queue, r.host, r.status) for r in results] == [("q1", "h1", "failed"),
                                                              ("q2", "h2", "launched")]
    assert (results[0].error or "").split(", free ")[0] == e.value.message.split(", free ")[0]
    assert results[0].lines()[0].startswith("q1: not launched on h1: h1: disk below budget")
    assert not (lp.shared / "queues" / "q1.ledger").exists()
    assert not (lp.shared / "queues" / "q1.txt").exists()
    wait_drained(lp, "h2", "q2", 1)
    assert (lp.shared / "final_ckpts" / "fits" / "MANIFEST.json").exists()


# --------------------------------------------------------------------------- round trips


def test_one_snapshot_and_one_command_per_host_before_and_one_after_per_command(
        local_project: Proj, counted: Counter[str]) -> None:
    lp = local_project
    for q, h in (("a1", "h1"), ("a2", "h1"), ("b1", "h2"), ("b2", "h2")):
        lp.queue(q, [f"# ablate: host={h}", lp.cfg(f"cfgs/{q}/{q}.yaml") + " recon 1"])
    project = load_project(lp.root)
    # Four queues on two hosts: one snapshot; one command per host before (tmux, budget, drift)
    # and one after (both its queues started); two batches of FS ops: deploy's files with the
    # reads of its record and of the four stop requests (`read_bytes` within the batch), then its
    # record (first time only), the queue copies, the stop requests removed, the ledger entries and
    # the estimates.
    first = Counter({"probe snapshot": 1, "ask h1": 1, "ask h2": 1, "start h1": 1, "start h2": 1,
                     "apply": 2, "read_bytes": 5})

    assert [r.status for r in launch_all(project)] == ["launched"] * 4
    assert counted == first
    for q, h in (("a1", "h1"), ("a2", "h1"), ("b1", "h2"), ("b2", "h2")):
        wait_drained(lp, h, q, 1)
    assert [len(ledger(lp, q)) for q in ("a1", "a2", "b1", "b2")] == [1] * 4

    counted.clear()
    assert [(r.status, r.resumed) for r in launch_all(project)] == [("launched", True)] * 4
    assert counted == first


def test_moving_a_queue_asks_its_last_host_once_and_refuses_while_it_runs_there(
        local_project: Proj, counted: Counter[str]) -> None:
    lp = local_project
    lp.queue("m", [lp.cfg("cfgs/m/long.yaml", step_time=0.2) + " recon 300"])  # no header: any host
    project = load_project(lp.root)
    launch(project, "m", "h1")
    counted.clear()
    recorded = [(lp.shared / "queues" / f).read_bytes() for f in ("m.txt", "m.ledger")]
    refused = r"^m is already running on h1; `ablate stop m --host h1` first$"
    with pytest.raises(AblateError, match=refused) as e:
        launch(project, "m", "h2")
    assert e.value.exit_code == 2
    # h2 asked (it was requested), h1 only for its tmux (the ledger's last host); no FS op, no deploy
    assert counted == Counter({"probe snapshot": 1, "ask h2": 1, "tmux h1": 1})
    assert [(lp.shared / "queues" / f).read_bytes() for f in ("m.txt", "m.ledger")] == recorded
    assert not (lp.shared / "events" / "h2.m.jsonl").exists()

    stop(project, "m", "h1")
    counted.clear()
    moved = launch(project, "m", "h2")
    assert (moved.host, moved.start_index, moved.resumed) == ("h2", 0, True)
    assert counted["probe snapshot"] == 1 and counted["tmux h1"] == counted["ask h2"] == 1
    assert [(e["host"], e["start_index"]) for e in ledger(lp, "m")] == [("h1", 0), ("h2", 0)]
    stop(project, "m", "h2")
