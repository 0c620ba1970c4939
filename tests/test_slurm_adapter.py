"""The Slurm adapter (wrappers/slurm_sessions.sh) against stand-ins of Slurm's client commands: how
often it asks Slurm and what (one filtered squeue per verb, sacct only for the sweep's ended ids and
once, sinfo only for its partitions, none at all within `slurm.poll` under polite polling), and how
it keeps to a submit limit (waiting entries, taken exactly once, transient errors retried, a
refusal in Slurm's words). The real cluster's side is tests/test_slurm_limits.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ablate.config.slurm import SlurmSettings
from ablate.transport.local import LocalHost
from ablate.transport.slurm import SlurmHost, polite_polling

# One program for every Slurm command: it logs its argv to calls.jsonl and answers from state.json
# (jobs: [name, id, state, nodes, reason, partition]; acct: id -> [state, nodes, exit]; sbatch: a
# list of answers to give in turn, {"err": ..., "rc": ...} or null for a submit).
FAKE = r'''
import fcntl, json, os, sys
d = os.environ["FAKE_SLURM"]
cmd, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.path.join(d, "lock"), "w") as lk:
    fcntl.flock(lk, fcntl.LOCK_EX)
    with open(os.path.join(d, "calls.jsonl"), "a") as f:
        f.write(json.dumps([cmd, *args]) + "\n")
    p = os.path.join(d, "state.json")
    st = json.load(open(p))
    def opt(name):
        return next((a.split("=", 1)[1] for a in args if a.startswith(name + "=")), None)
    rc = 0
    if cmd == "squeue" and st.get("squeue_err"):
        sys.stderr.write(st["squeue_err"] + "\n")
        rc = 1
    elif cmd == "squeue":
        names = set((opt("--name") or "").split(",")) if opt("--name") else None
        for j in st["jobs"]:
            if names is None or j[0] in names:
                print("|".join(j) if "%j" in args[-1] else j[1])
    elif cmd == "sbatch":
        sys.stdin.read()
        answers = st.setdefault("sbatch", [])
        got = answers.pop(0) if answers else None
        if not got and st.get("limit") and len(st["jobs"]) >= int(st["limit"]):
            got = {"err": "sbatch: error: AssocMaxSubmitJobLimit"}
        if got and got.get("submit"):  # submitted, but the answer was lost
            st["next"] = st.get("next", 100) + 1
            st["jobs"].append([opt("--job-name"), str(st["next"]), "PENDING", "", "None", "main"])
        if got:
            sys.stderr.write(got["err"] + "\n")
            rc = got.get("rc", 1)
        else:
            st["next"] = st.get("next", 100) + 1
            st["jobs"].append([opt("--job-name"), str(st["next"]), "PENDING", "", "None", "main"])
            print(st["next"])
    elif cmd == "sacct":
        ids = opt("-j") or (args[args.index("-j") + 1] if "-j" in args else "")
        for i in ids.split(","):
            if i in st["acct"]:
                print("|".join([i, *st["acct"][i]]))
    elif cmd == "sinfo":
        print("sn1 idle\nsn2 down*")
    elif cmd == "scontrol":
        print("AccountingStorageEnforce = associations,limits\nClusterName = c\nMaxArraySize = 1001")
    elif cmd == "sacctmgr":
        if "assoc" in args:
            print(f"acct||{st.get('limit', '')}|||normal")
        else:
            print("||")
    elif cmd == "scancel":
        st["jobs"] = [j for j in st["jobs"] if j[1] not in args]
    json.dump(st, open(p + ".tmp", "w"))
    os.replace(p + ".tmp", p)
sys.exit(rc)
'''
COMMANDS = ("squeue", "sbatch", "sacct", "sinfo", "scontrol", "sacctmgr", "scancel")
PREFIX = "ablate-sw-c-"


class Fake:
    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dir = tmp / "fake"
        bindir = self.dir / "bin"
        bindir.mkdir(parents=True)
        for c in COMMANDS:
            p = bindir / c
            # -S: the stand-in needs only the standard library; without site it starts in a tenth
            # of the time (the adapter runs dozens of these commands per test)
            p.write_text(f"#!{sys.executable} -S\n{FAKE}")
            p.chmod(p.stat().st_mode | stat.S_IEXEC)
        self.state({"jobs": [], "acct": {}})
        monkeypatch.setenv("FAKE_SLURM", str(self.dir))
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("USER", "tester")
        self.out = tmp / "fs" / "slurm"
        self.host = SlurmHost("c", LocalHost("c"), SlurmSettings(partition="main", poll=30), str(self.out),
                              PREFIX)

    def state(self, value: dict[str, Any] | None = None) -> dict[str, Any]:
        p = self.dir / "state.json"
        if value is not None:
            p.write_text(json.dumps(value))
        return dict(json.loads(p.read_text()))

    def calls(self) -> list[list[str]]:
        p = self.dir / "calls.jsonl"
        out = [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
        p.unlink(missing_ok=True)
        return out

    def verb(self, *args: str, rc: int = 0) -> str:
        r = self.host.run([*self.host.tmux_argv(), *args])
        assert r.rc == rc, (r.rc, r.stdout, r.stderr)
        return r.stdout

    def start(self, queue: str, rc: int = 0) -> str:
        return self.verb("new-session", "-d", "-s", PREFIX + queue, "echo hi", rc=rc)

    def waiting(self) -> list[str]:
        d = self.out / "waiting"
        return sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) if d.exists() else []


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    return Fake(tmp_path, monkeypatch)


def _names(calls: list[list[str]]) -> list[str]:
    return [c[0] for c in calls]


def test_status_asks_one_filtered_squeue_sacct_for_ended_ids_once_and_sinfo_for_its_partitions(
        fake: Fake) -> None:
    assert fake.start("q1").strip() == "101" and fake.start("q2").strip() == "102"
    fake.calls()
    st = fake.state()
    st["jobs"] = [j for j in st["jobs"] if j[1] != "101"]
    st["jobs"].append(["someone-else", "7", "RUNNING", "sn1", "None", "x"])
    st["acct"] = {"101": ["COMPLETED", "sn1", "0:0"], "7": ["COMPLETED", "sn1", "0:0"]}
    fake.state(st)
    out = fake.verb("list-sessions").splitlines()
    calls = fake.calls()
    assert sorted(_names(calls)) == ["sacct", "sinfo", "squeue"], calls
    squeue = next(c for c in calls if c[0] == "squeue")
    assert "-u" in squeue and "tester" in squeue and \
        set(next(a for a in squeue if a.startswith("--name=")).split("=", 1)[1].split(",")) == \
        {PREFIX + "q1", PREFIX + "q2"}, squeue
    assert next(c for c in calls if c[0] == "sacct")[-4:-2] == ["-j", "101"], calls
    assert next(c for c in calls if c[0] == "sinfo")[3:5] == ["-p", "main"], calls
    assert f"!job {PREFIX}q2|102|PENDING||None" in out and "someone-else" not in "\n".join(out), out
    assert f"!done {PREFIX}q1|101|COMPLETED|sn1|0:0" in out and "!node sn2 down*" in out, out
    # The ended job's state is kept: sacct is not asked again.
    again = fake.verb("list-sessions").splitlines()
    assert sorted(_names(fake.calls())) == ["sinfo", "squeue"] and again == out


def test_under_polite_polling_slurm_is_asked_at_most_every_poll_seconds(fake: Fake) -> None:
    fake.start("q1")
    fake.calls()
    first = fake.verb("list-sessions")
    assert "squeue" in _names(fake.calls())
    with polite_polling():
        for _ in range(3):
            assert fake.verb("list-sessions") == first
    assert fake.calls() == []  # answered from the last answer (younger than poll = 30 s)
    fake.verb("list-sessions")
    assert "squeue" in _names(fake.calls())  # plain status always asks
    with polite_polling():
        fake.start("q2")  # anything that changes the jobs drops the old answer
        fake.calls()
        assert f"{PREFIX}q2" in fake.verb("list-sessions")
        assert "squeue" in _names(fake.calls())


def test_past_the_submit_limit_queues_wait_and_are_each_taken_once(fake: Fake) -> None:
    """Limit 3 (sacctmgr): the controller submits 2 (one place is kept for a finishing job's hook),
    the others wait with their job script and options; two hooks at once take each waiting queue
    exactly once, up to the limit; status lists the rest as WAITING, and submits when there is room."""
    st = fake.state()
    st["limit"] = "3"
    fake.state(st)
    for q in ("q1", "q2", "q3", "q4", "q5"):
        fake.start(q)
    assert len(fake.state()["jobs"]) == 2
    assert fake.waiting() == [PREFIX + q for q in ("q3", "q4", "q5")]
    entry = fake.out / "waiting" / f"{PREFIX}q3"
    opts = (entry / "opts").read_text().split("\0")
    assert f"--job-name={PREFIX}q3" in opts and "--partition=main" in opts, opts
    script = (entry / "job.sh").read_text()
    assert "export ABLATE_SLURM_ON_EXIT=" in script and script.rstrip().endswith("exec echo hi"), script
    hook = script.split("export ABLATE_SLURM_ON_EXIT=", 1)[1].split("\n", 1)[0]
    assert "submit limit 3" in (entry / "why").read_text()
    assert Path(hook).is_file()  # there while queues wait: run_queue runs it as a job ends
    out = fake.verb("list-sessions")
    assert f"!job {PREFIX}q4|-|WAITING||submit limit 3" in out, out
    # Two jobs end at once and both hooks run: room for 2 more (limit 3, one job left).
    st = fake.state()
    st["jobs"] = st["jobs"][:1]
    fake.state(st)
    fake.calls()
    runs = [threading.Thread(target=subprocess.run, args=(["bash", "--", hook],),
                             kwargs={"capture_output": True, "timeout": 60}) for _ in range(2)]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    tried = [next(a.split("=", 1)[1] for a in c if a.startswith("--job-name="))
             for c in fake.calls() if c[0] == "sbatch"]
    # Both hooks saw room for 2, so the one past the limit (whichever lost the race to sbatch) was
    # refused by Slurm and put back to wait, where the other hook may try it again (refused again:
    # CI's load made that order); a queue is never submitted twice.
    assert set(tried) <= {PREFIX + q for q in ("q3", "q4", "q5")} and len(tried) <= 4, tried
    jobs = sorted(j[0] for j in fake.state()["jobs"])
    assert len(set(jobs)) == len(jobs), jobs
    taken = [q for q in ("q3", "q4", "q5") if PREFIX + q in jobs]
    assert jobs[0] == PREFIX + "q1" and len(jobs) == 3 and len(taken) == 2, jobs
    (left,) = {"q3", "q4", "q5"} - set(taken)
    assert fake.waiting() == [PREFIX + left]
    if PREFIX + left in tried:
        assert "AssocMaxSubmitJobLimit" in (fake.out / "waiting" / f"{PREFIX}{left}" / "why").read_text()
    # The last one: status submits it once there is room (below the limit minus the kept place).
    st = fake.state()
    st["jobs"] = []
    fake.state(st)
    out = fake.verb("list-sessions")
    assert fake.waiting() == [] and f"{PREFIX}{left}\n!job {PREFIX}{left}|" in out, out
    fake.verb("list-sessions")
    assert not Path(hook).exists()  # nothing waits: a job's end runs nothing at all


def test_transient_errors_are_retried_and_a_refusal_is_kept_in_slurms_words(
        fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_SLURM_RETRY_PAUSE", "0.1")  # sbatch tried again after 0.2 s, not 2 s
    st = fake.state()
    st["sbatch"] = [{"err": "sbatch: error: Socket timed out on send/recv operation"}, None,
                    {"err": "sbatch: error: invalid partition specified: nosuch"},
                    {"err": "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job "
                            "submission failed: Job violates accounting/QOS policy"}]
    fake.state(st)
    assert fake.start("q1").strip() == "101"  # after one retry
    assert _names(fake.calls()).count("sbatch") == 2
    r = fake.host.run([*fake.host.tmux_argv(), "new-session", "-d", "-s", PREFIX + "q3", "true"])
    assert r.rc == 1 and "invalid partition specified: nosuch" in r.stderr, r
    assert PREFIX + "q3" not in fake.waiting()
    got = fake.start("q2")
    assert got.startswith(f"waiting {PREFIX}q2: sbatch: error: QOSMaxSubmitJobPerUserLimit"), got
    fake.calls()
    out = fake.verb("list-sessions")  # the limit learned (1 job): nothing submitted, the words shown
    assert f"!job {PREFIX}q2|-|WAITING||sbatch: error: QOSMaxSubmitJobPerUserLimit" in out, out
    assert "sbatch" not in _names(fake.calls())
    fake.start("q2", rc=1)  # a waiting queue is live: never a second copy
    fake.verb("kill-session", "-t", f"={PREFIX}q2")
    assert fake.waiting() == []
    # An answer lost after the job was taken: squeue says so, and it is not submitted twice.
    (fake.out / f".limits.{PREFIX}").unlink()  # the learned limit forgotten (it expires)
    st = fake.state()
    st["sbatch"] = [{"err": "sbatch: error: Socket timed out on send/recv operation", "submit": True}]
    fake.state(st)
    fake.calls()
    assert fake.start("q4").strip() == "102"
    assert _names(fake.calls()).count("sbatch") == 1
    assert [j[0] for j in fake.state()["jobs"]].count(PREFIX + "q4") == 1


def test_a_launch_of_40_queues_fits_one_command_line(fake: Fake) -> None:
    """Each verb's command line carries the adapter's path, not its text: the sections of a launch
    of 40 queues stay far below Linux's 128 KiB limit of one argument."""
    line = " ".join(fake.host.tmux_argv())
    assert len(line) < 2000 and fake.host.adapter_path.endswith(".sh"), line
    assert Path(fake.host.adapter_path).stat().st_mode & 0o222 == 0  # placed read-only


def test_status_watch_asks_slurm_politely_and_plain_status_does_not_wait(
        fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status --watch` runs its dashboard under polite polling: a Slurm host's verbs carry
    `slurm.poll` as the answer's allowed age; outside it they carry 0 (ask Slurm now)."""
    from ablate.monitor import status

    def age() -> str:
        argv = fake.host.tmux_argv()
        return argv[argv.index(PREFIX) + 1]

    seen: list[str] = []
    monkeypatch.setattr("ablate.monitor.watch.run_watch", lambda fetch, interval: seen.append(age()))
    status.watch(None, 2.0)  # type: ignore[arg-type]  # the dashboard is replaced: no project read
    assert seen == ["30"] and age() == "0"


def test_a_squeue_that_fails_is_retried_then_reported_in_its_words(
        fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_SLURM_RETRY_PAUSE", "0.1")  # its tries 0.1 s and 0.2 s apart, not 1 s and 2 s
    fake.start("q1")
    st = fake.state()
    st["squeue_err"] = ("squeue: error: slurm_load_jobs error: Unable to contact slurm controller "
                        "(connect failure)")
    fake.state(st)
    fake.calls()
    r = fake.host.run([*fake.host.tmux_argv(), "list-sessions"])
    assert r.rc != 0 and "Unable to contact slurm controller" in r.stderr, r
    assert _names(fake.calls()) == ["squeue"] * 3  # a transient error: tried again after 1 and 2 pauses
