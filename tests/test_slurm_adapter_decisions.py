"""The Slurm adapter's decisions (`ablate/remote/slurm/adapter.py`, asked by its co-process
`adapter_serve.py`) over Slurm's real output, captured from the Slurm bed (tests/data/slurm/, its
README says how), in milliseconds: the submit limit from scontrol and sacctmgr, sbatch's errors
read as a limit, a passing error or a refusal, the array limits and split, squeue's rows with array
tasks as their queues' sessions, sacct's states, sinfo's nodes out of service, the waiting queues'
hand-out and the co-process's protocol. The adapter against stand-in commands is
tests/test_slurm_adapter.py, against the real cluster tests/test_slurm_limits.py."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ablate.doctor import slurm
from ablate.remote.slurm import adapter as sa
from ablate.remote.slurm.adapter import Fact, Limit, Need, Row
from ablate.remote.slurm.adapter_serve import Verb, serve, shell

DATA = Path(__file__).parent / "data" / "slurm"
CLUSTER = "ablate3d8478"  # the accounting bed's ClusterName
ARRAY = "ablate-sw-cluster-q5.a123456780"


def text(name: str) -> str:
    return (DATA / name).read_text()


ENFORCED = text("scontrol_show_config.accounting_limits.txt")
PLAIN = text("scontrol_show_config.plain.txt")
ASSOC = text("sacctmgr_show_assoc.user_root.txt")  # lab|main|4||lowsub|lowsub,normal / root||5|||normal
QOS = {"lowsub": text("sacctmgr_show_qos.lowsub.txt"), "normal": text("sacctmgr_show_qos.normal.txt")}


def limit_of(opts: list[str], config: str = ENFORCED, assoc: Fact | None = None) -> tuple[Limit, list[Need]]:
    """The limit as the adapter reaches it: each command asked in turn, answered from the bed."""
    facts: dict[str, Fact] = {}
    asked: list[Need] = []
    while not isinstance(step := sa.submit_limit(opts, facts), Limit):
        asked.append(step)
        facts[step.what] = {"config": Fact(0, config), "assoc": assoc or Fact(0, ASSOC)}.get(
            step.what, Fact(0, QOS.get(step.arg, "")))
    return step, asked


# --------------------------------------------------------------------------- the submit limit

def test_the_limit_is_the_least_of_the_accounts_association_and_its_qos() -> None:
    got, asked = limit_of(["--account=lab", "--partition=main"])
    assert got == Limit(3, "sacctmgr-qos-lowsub")  # assoc MaxSubmit 4, QOS MaxSubmitPU 3, GrpSubmit 8
    assert asked == [Need("config", "", 20), Need("assoc", CLUSTER, 20), Need("qos", "lowsub", 20)]
    # Account root: its association's 5, its QOS (normal, the first of its list) has no limit.
    assert limit_of(["--account=root"])[0] == Limit(5, "sacctmgr-assoc")
    # No account given: every association of the user may take the job; the least holds.
    assert limit_of([])[0] == Limit(3, "sacctmgr-qos-lowsub")
    # --qos wins over the association's default.
    assert limit_of(["--account=lab", "--qos=normal"])[0] == Limit(4, "sacctmgr-assoc")


def test_an_association_of_another_partition_does_not_limit() -> None:
    got, asked = limit_of(["--account=lab", "--partition=urgent"])
    assert got == Limit(None, "none") and [n.what for n in asked] == ["config", "assoc"]
    assert limit_of(["--account=lab", "--partition=urgent,main"])[0] == Limit(3, "sacctmgr-qos-lowsub")


def test_a_cluster_that_does_not_enforce_limits_is_not_asked_sacctmgr() -> None:
    got, asked = limit_of([], config=PLAIN)
    assert got == Limit(None, "not-enforced") and [n.what for n in asked] == ["config"]


def test_without_scontrol_sacctmgr_is_asked_all_the_same_and_a_failing_sacctmgr_is_no_limit() -> None:
    facts = {"config": Fact(1, "", "scontrol: error: Unable to contact slurm controller")}
    assert sa.submit_limit([], facts) == Need("assoc", "", 20)  # no cluster known: all of them
    assert sa.submit_limit([], {**facts, "assoc": Fact(1, "")}) == Limit(None, "none")
    # A QOS that sacctmgr cannot show leaves the association's limit.
    assert sa.submit_limit(["--account=lab"], {**facts, "assoc": Fact(0, ASSOC), "qos": Fact(1, "")}) == \
        Limit(4, "sacctmgr-assoc")


def test_a_known_limit_is_kept_for_limits_age_and_a_learned_one_half_as_long() -> None:
    now = 1_800_000_000.0
    line = sa.limits_line(Limit(3, "sacctmgr-qos-lowsub"), now)
    assert line == "1800000000 3 sacctmgr-qos-lowsub"
    assert sa.cached_limit(line, now + sa.LIMITS_AGE - 1) == Limit(3, "sacctmgr-qos-lowsub")
    assert sa.cached_limit(line, now + sa.LIMITS_AGE) is None
    unenforced = Limit(None, "not-enforced")
    assert sa.cached_limit(sa.limits_line(unenforced, now), now) == unenforced
    assert sa.cached_limit("", now) is None and sa.cached_limit("garbage 3 x", now) is None
    limit, kept = sa.learned(0, now)  # at 0 of ours, the user's other jobs fill it: try one
    assert limit == Limit(1, "learned") and sa.learned(4, now)[0] == Limit(4, "learned")
    assert sa.cached_limit(kept, now + sa.LIMITS_AGE // 2 - 1) == limit
    assert sa.cached_limit(kept, now + sa.LIMITS_AGE // 2) is None


def test_the_controller_keeps_one_place_for_a_finishing_jobs_hook() -> None:
    assert sa.session_why(Limit(3, "x"), 1, None) == ""
    assert sa.session_why(Limit(3, "x"), 2, None) == \
        "submit limit 3 (x): 2 of this sweep's jobs are in Slurm; submitted as one ends"
    assert sa.session_why(Limit(1, "x"), 0, None) == ""  # a limit of one keeps nothing back
    assert sa.session_why(Limit(None, "none"), 500, None) == ""
    assert sa.session_why(Limit(None, "none"), 0, "Socket timed out").startswith(
        "slurmctld did not take a job a moment ago: Socket timed out")
    assert sa.busy_why("1800000000 Socket timed out", 1_800_000_059) == "Socket timed out"
    assert sa.busy_why("1800000000 Socket timed out", 1_800_000_060) is None


# --------------------------------------------------------------------------- sbatch's errors

@pytest.mark.parametrize(("err", "kind"), [
    ("sbatch.assoc_max_submit_limit.err", "limit"),
    ("sbatch.qos_max_submit_per_user_limit.err", "limit"),
    ("sbatch.invalid_partition.err", "refused"),
    ("sbatch.invalid_account.err", "refused"),
    ("sbatch.invalid_qos.err", "refused"),
    ("sbatch.controller_unreachable.err", "transient"),
])
def test_sbatchs_error_is_a_limit_a_passing_error_or_a_refusal(err: str, kind: str) -> None:
    v = sa.read_sbatch(1, text(err), 1, 0.0)
    assert v.kind == kind and "\n" not in v.why and v.why == text(err).strip().replace("\n", " "), v
    assert v.look == (kind == "transient")  # it may have submitted all the same: squeue is asked
    assert (v.pause is not None) == (kind == "transient")


def test_a_passing_error_is_tried_again_within_the_submits_time_and_a_time_out_never() -> None:
    err = text("sbatch.controller_unreachable.err")
    assert [sa.read_sbatch(1, err, t, 0.0).pause for t in (1, 2, 3)] == [2, 4, None]
    assert sa.read_sbatch(1, err, 1, sa.SBATCH_TIMEOUT).pause is None
    v = sa.read_sbatch(124, "", 1, 0.0)  # slurmctld did not answer: it waits, but it may have taken it
    assert v == sa.Verdict("transient", f"sbatch did not answer within {sa.SBATCH_TIMEOUT}s", True, None)
    assert sa.read_sbatch(127, "bash: sbatch: command not found", 1, 0.0) == \
        sa.Verdict("transient", "bash: sbatch: command not found", False, None)


def test_a_query_is_asked_again_only_for_a_passing_error() -> None:
    assert sa.retryable(1, sa.one_line(text("squeue.controller_unreachable.err")))
    assert sa.retryable(124, "")
    assert not sa.retryable(1, sa.one_line(text("sbatch.invalid_partition.err")))


# --------------------------------------------------------------------------- job arrays

def test_max_array_size_is_read_in_one_place_for_the_adapter_and_doctor() -> None:
    assert sa.array_most(ENFORCED) == 2  # MaxArraySize 3, SchedulerParameters max_array_tasks=2
    assert sa.array_most(PLAIN) == 1001 and sa.array_most(None) == sa.ARRAY_SIZE == 1001
    assert sa.array_most("MaxArraySize            = 0\n") == 0
    assert slurm.array_most is sa.array_most


def test_the_queues_go_as_arrays_within_the_room_and_share_the_throttle() -> None:
    none = Limit(None, "not-enforced")
    plan = sa.array_plan(2, none, 0, 5, 3, None)
    assert plan == sa.ArrayPlan(5, [(0, 2), (2, 2), (4, 1)], "%1", "")
    assert sa.array_plan(2, none, 0, 5, 0, None) == sa.ArrayPlan(5, [(0, 2), (2, 2), (4, 1)], "", "")
    assert sa.array_plan(1001, none, 0, 4, 2, None) == sa.ArrayPlan(4, [(0, 4)], "%2", "")
    assert sa.array_plan(2, none, 0, 5, 2, None) == \
        "5 queues need 3 arrays (MaxArraySize 2) but throttle is 2: raise throttle to at least 3"
    # Limit 4, one of ours in Slurm, one place kept: room for 2, the rest wait.
    plan = sa.array_plan(1001, Limit(4, "sacctmgr-assoc"), 1, 5, 0, None)
    assert plan == sa.ArrayPlan(2, [(0, 2)], "", "submit limit 4 (sacctmgr-assoc): this sweep's jobs in "
                                                "Slurm would be more")
    assert sa.array_plan(1001, Limit(4, "x"), 9, 5, 0, None).room == 0
    busy = sa.array_plan(1001, none, 0, 3, 0, "Socket timed out")
    assert isinstance(busy, sa.ArrayPlan) and busy.room == 0 and busy.slices == []


def test_an_array_script_runs_task_is_queue_and_nothing_else() -> None:
    script = sa.array_script("/fs/slurm/waiting/.on_exit.1.sh", ["s-a", "s-b"],
                             ["bash a.sh", "bash 'b c'.sh"])
    assert "export ABLATE_SLURM_ON_EXIT=/fs/slurm/waiting/.on_exit.1.sh\n" in script
    assert "0) exec bash a.sh ;;\n1) exec bash 'b c'.sh ;;\nesac\n" in script
    for task, out in (("0", "a.sh\n"), ("1", "b c.sh\n"), ("7", "")):
        r = subprocess.run(["bash", "-c", script.replace("exec bash", "exec echo")],
                           env={**os.environ, "SLURM_ARRAY_TASK_ID": task}, capture_output=True, text=True)
        assert r.stdout == out and r.returncode == (0 if out else 2), r


# --------------------------------------------------------------------------- squeue, sacct, sinfo

def test_an_array_tasks_session_is_its_line_of_the_arrays_tasks_file() -> None:
    rows = sa.task_rows(text("squeue.sweep_jobs_and_array_tasks.txt"),
                        {ARRAY: ["ablate-sw-cluster-q5", "ablate-sw-cluster-q6"]})
    assert rows == [Row("ablate-sw-cluster-q6", "13_1", "PENDING", "", "JobArrayTaskLimit", "main"),
                    Row("ablate-sw-cluster-q8", "14", "PENDING", "", "JobHeldUser", "main"),
                    Row("ablate-sw-cluster-q3", "11", "RUNNING", "sn1", "None", "main"),
                    Row("ablate-sw-cluster-q5", "13_0", "RUNNING", "sn2", "None", "main")]
    # Without its tasks (not written yet, or a task past them) an array task keeps its job name.
    assert [r.session for r in sa.task_rows(text("squeue.sweep_jobs_and_array_tasks.txt"),
                                            {ARRAY: ["only-task-0"]})][::3] == [ARRAY, "only-task-0"]
    assert sa.task_rows("\n\n", {}) == []


def test_the_sweeps_names_are_its_records_and_never_an_array_tasks_output_link() -> None:
    files = ["ablate-sw-c-q1.jobs", "ablate-sw-c-q1.out", f"{ARRAY}.tasks", f"{ARRAY}.0.out",
             f"{ARRAY}.tasks.tmp", ".adapter.0123.sh", ".doctor.x.out", ".listing.ablate-sw-c-", "waiting"]
    assert sa.sweep_names(files) == ["ablate-sw-c-q1", ARRAY]


def test_sacct_states_terminal_ones_kept() -> None:
    who = {"9": "q1", "10": "q2", "11": "q3", "12": "q4", "13_0": "q5", "14": "q8", "99": "q9"}
    assert sa.ended_rows(text("sacct.states.txt"), who) == [
        ("q1|9|COMPLETED|sn1|0:0", True), ("q2|10|FAILED|sn2|3:0", True),
        ("q3|11|TIMEOUT|sn1|0:0", True), ("q4|12|CANCELLED by 0|sn2|0:0", True),
        ("q8|14|PENDING|None assigned|0:0", False), ("q5|13_0|RUNNING|sn2|0:0", False)]
    assert sa.ended_rows(text("sacct.states.txt"), {"10": "q2"}) == [("q2|10|FAILED|sn2|3:0", True)]
    for state in sa.TERMINAL:
        assert sa.terminal(state)
    assert not any(sa.terminal(s) for s in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "SUSPENDED", ""))


def test_nodes_out_of_service_and_the_default_partition() -> None:
    assert sa.out_of_service(text("sinfo_nodes.down_drain.txt")) == ["!node sn2 drained", "!node sn3 down*"]
    assert sa.out_of_service("sn1 mixed\nsn2 idle*\nsn3 draining\nsn4 allocated\n") == \
        ["!node sn2 idle*", "!node sn3 draining"]
    assert sa.default_partition(text("sinfo_partitions.txt")) == "main"
    assert sa.default_partition("gpu\ncpu\n") is None


# --------------------------------------------------------------------------- waiting queues

def test_a_waiting_hook_holds_on_only_while_another_job_may_end() -> None:
    assert sa.hold_on(["11", "12"], "12", []) is True  # 11 runs: it may end and free a place
    assert sa.hold_on(["12"], "12", []) is False  # no other job: the next status submits
    assert sa.hold_on(["11", "12"], "", []) is False  # not in a job
    # Every other job is a waiting hook too: the highest id leaves, the others hold on.
    assert sa.hold_on(["11", "12", "13"], "13", ["11", "12"]) is False
    assert sa.hold_on(["11", "12", "13"], "12", ["11", "13"]) is True
    assert sa.hold_on(["13_0", "13_1"], "13_1", ["13_0"]) is False
    assert sa.hold_on(["13_0", "13_1"], "13_0", ["13_1"]) is True
    assert sa.above("14", "13_1") and sa.above("13_2", "13_1") and not sa.above("13", "13_1")


def test_the_oldest_waiting_queue_is_taken_while_there_is_room() -> None:
    limit = Limit(3, "sacctmgr-qos-lowsub")
    assert sa.next_take([], limit, 0, 0, False, 0, 0, 0, False) == sa.Take("none")
    assert sa.next_take(["a", "b"], limit, 1, 1, False, 0, 0, 0, False) == sa.Take("take", "a")
    assert sa.next_take(["a", "b"], limit, 1, 2, False, 0, 0, 0, True) == sa.Take("leave")  # status
    assert sa.next_take(["a"], Limit(None, "none"), 0, 99, False, 0, 0, 0, False) == sa.Take("take", "a")
    hook = [sa.next_take(["a"], limit, 0, 3, False, 0, w, 90, True).pause for w in range(5)]
    assert hook == [2, 4, 8, 16, 16]
    assert sa.next_take(["a"], limit, 0, 3, False, 75, 3, 90, True) == sa.Take("leave")  # past patience
    assert sa.next_take(["a"], limit, 0, 3, True, 0, 0, 90, True) == sa.Take("leave")  # it took one
    assert sa.next_take(["a"], limit, 0, 3, False, 0, 0, 90, False) == sa.Take("leave")


# --------------------------------------------------------------------------- one verb's view

Answers = Mapping[str, Fact | list[Fact]]


def drive(step: Generator[Need, Fact, Any], answers: Answers) -> tuple[Any, list[Need]]:
    """Run a question as the adapter does, Slurm's answers from `answers` (a list: in turn)."""
    queue = {k: list(v) if isinstance(v, list) else v for k, v in answers.items()}
    asked: list[Need] = []
    try:
        need = next(step)
        while True:
            asked.append(need)
            got = queue.get(need.what, Fact(0, ""))
            need = step.send(got.pop(0) if isinstance(got, list) else got)
    except StopIteration as done:
        return done.value, asked


def sweep(tmp_path: Path) -> Path:
    out = tmp_path / "slurm"
    (out / "waiting").mkdir(parents=True)
    for q in ("q1", "q2", "q3", "q4", "q8"):
        (out / f"ablate-sw-cluster-{q}.jobs").write_text({"q1": "7\n9\n", "q2": "10\n", "q3": "11\n",
                                                           "q4": "12\n", "q8": "14\n"}[q])
    (out / f"{ARRAY}.tasks").write_text("ablate-sw-cluster-q5\nablate-sw-cluster-q6\n")
    return out


def test_status_lists_the_sweeps_jobs_and_asks_sacct_only_for_the_ended(tmp_path: Path) -> None:
    out = sweep(tmp_path)
    (out / "ablate-sw-cluster-q2.done").write_text("ablate-sw-cluster-q2|10|FAILED|sn2|3:0\n")
    (out / "waiting" / "ablate-sw-cluster-q7").mkdir()
    (out / "waiting" / "ablate-sw-cluster-q7" / "why").write_text("submit limit 3 (x): 2 of this | that\n")
    v = Verb(str(out), "ablate-sw-cluster-", ["--partition=main"], now=1_800_000_000)
    squeue = Fact(0, text("squeue.sweep_jobs_and_array_tasks.txt"))
    assert drive(v.q_jobs(), {"squeue": squeue}) == ({}, [Need("squeue", ",".join(
        [*(f"ablate-sw-cluster-q{i}" for i in (1, 2, 3, 4)), ARRAY, "ablate-sw-cluster-q8"]), 30)])
    reply, asked = drive(v.answer(["listing"]), {"acct": Fact(0, text("sacct.states.txt")),
                                                 "nodes": Fact(0, text("sinfo_nodes.down_drain.txt"))})
    assert asked == [Need("acct", "9,12", 30), Need("nodes", "main", 30)]  # q2's end is kept
    assert reply["listing"].splitlines() == [
        "ablate-sw-cluster-q6", "!job ablate-sw-cluster-q6|13_1|PENDING||JobArrayTaskLimit",
        "ablate-sw-cluster-q8", "!job ablate-sw-cluster-q8|14|PENDING||JobHeldUser",
        "ablate-sw-cluster-q3", "!job ablate-sw-cluster-q3|11|RUNNING|sn1|None",
        "ablate-sw-cluster-q5", "!job ablate-sw-cluster-q5|13_0|RUNNING|sn2|None",
        "ablate-sw-cluster-q7", "!job ablate-sw-cluster-q7|-|WAITING||submit limit 3 (x): 2 of this / that ",
        "!done ablate-sw-cluster-q2|10|FAILED|sn2|3:0",
        "!done ablate-sw-cluster-q1|9|COMPLETED|sn1|0:0",
        "!done ablate-sw-cluster-q4|12|CANCELLED by 0|sn2|0:0",
        "!node sn2 drained", "!node sn3 down*"]
    assert reply["puts"] == [
        str(out / "ablate-sw-cluster-q1.done"), "ablate-sw-cluster-q1|9|COMPLETED|sn1|0:0",
        str(out / "ablate-sw-cluster-q4.done"), "ablate-sw-cluster-q4|12|CANCELLED by 0|sn2|0:0"]


def test_a_failing_sacct_is_not_asked_again_for_a_while_and_the_default_partition_is_kept(
        tmp_path: Path) -> None:
    out = sweep(tmp_path)
    now = 1_800_000_000
    v = Verb(str(out), "ablate-sw-cluster-", [], now=now)
    reply, asked = drive(v.answer(["listing"]), {
        "acct": [Fact(1, "", "sacct: error: Unable to contact slurm controller")] * 3,
        "partition": Fact(0, text("sinfo_partitions.txt")), "nodes": Fact(0, "sn1 idle\n")})
    assert [n.what for n in asked] == ["acct", "sleep", "acct", "sleep", "acct", "partition", "nodes"]
    assert reply["puts"] == [str(out / ".noacct"), str(now), str(out / ".partition"), "main"]
    (out / ".noacct").write_text(f"{now}\n")
    (out / ".partition").write_text("main\n")
    v = Verb(str(out), "ablate-sw-cluster-", [], now=now + sa.NOACCT_AGE - 1)
    assert [n.what for n in drive(v.answer(["listing"]), {})[1]] == ["nodes"]


def test_a_refused_submit_for_a_limit_learns_it_and_a_passing_one_makes_the_next_submits_wait(
        tmp_path: Path) -> None:
    out = sweep(tmp_path)
    v = Verb(str(out), "ablate-sw-cluster-", [], now=1_800_000_000)
    v.live = 2
    reply, asked = drive(v.answer(["submit", "ablate-sw-cluster-q9", "/d"]),
                         {"sbatch": Fact(1, "", text("sbatch.qos_max_submit_per_user_limit.err"))})
    assert reply["kind"] == "limit" and reply["id"] == "" and [n.what for n in asked] == ["sbatch"]
    assert reply["puts"] == [str(out / ".limits.ablate-sw-cluster-"), f"{1_800_000_000 - 300} 2 learned"]
    assert v.limit == Limit(2, "learned")
    unreachable = Fact(1, "", text("sbatch.controller_unreachable.err"))
    reply, asked = drive(v.answer(["submit", "ablate-sw-cluster-q9", "/d"]),
                         {"sbatch": unreachable, "look": Fact(0, "")})
    assert [(n.what, n.arg) for n in asked] == [
        ("sbatch", "/d"), ("look", "ablate-sw-cluster-q9"), ("sleep", "2"), ("sbatch", "/d"),
        ("look", "ablate-sw-cluster-q9"), ("sleep", "4"), ("sbatch", "/d"), ("look", "ablate-sw-cluster-q9")]
    assert reply["kind"] == "transient" and reply["puts"][0] == str(out / ".busy")
    # An answer lost after Slurm took the job: squeue has it, it is not submitted twice.
    reply, asked = drive(v.answer(["submit", "ablate-sw-cluster-q9", "/d"]),
                         {"sbatch": unreachable, "look": Fact(0, text("squeue.look.txt"))})
    assert reply == {"id": "14", "kind": "", "why": ""} and [n.what for n in asked] == ["sbatch", "look"]
    refused = Fact(1, "", text("sbatch.invalid_partition.err"))
    reply, _ = drive(v.answer(["submit", "x", "/d"]), {"sbatch": refused})
    assert reply == {"id": "", "kind": "refused", "why": text("sbatch.invalid_partition.err").strip().replace(
        "\n", " ")}  # refused for good: no look, no learning, no wait
    assert drive(v.answer(["submit", "x", "/d"]), {"sbatch": Fact(0, "15;cluster\n")})[0]["id"] == "15"


def test_a_hook_takes_the_oldest_waiting_queue_once_and_leaves_when_slurm_is_full(tmp_path: Path) -> None:
    out = sweep(tmp_path)
    for q in ("b", "a", "c"):
        (out / "waiting" / f"ablate-sw-cluster-{q}").mkdir()
    (out / "waiting" / "ablate-sw-cluster-a" / "refused").write_text("")
    (out / ".limits.ablate-sw-cluster-").write_text("1800000000 3 sacctmgr-assoc\n")
    v = Verb(str(out), "ablate-sw-cluster-", [], now=1_800_000_010)
    v.rows, v.live = [Row("ablate-sw-cluster-q3", "11")], 1
    step = drive(v.answer(["take", "hook", "0", "11"]), {})
    assert step == ({"next": "take", "entry": "ablate-sw-cluster-b", "pause": 0}, [])  # a was refused
    submitted = drive(v.answer(["submit", "ablate-sw-cluster-b", "/d"]), {"sbatch": Fact(0, "20\n")})
    assert submitted[0]["id"] == "20"
    assert v.live == 2 and v.rows[-1] == Row("ablate-sw-cluster-b", "20", "PENDING", "", "None")
    assert drive(v.answer(["take", "hook", "1", "11"]), {})[0]["entry"] == "ablate-sw-cluster-c"
    v.live = 3  # full: having taken one, a hook leaves (its own end frees the next place)
    v.tried.discard("ablate-sw-cluster-c")
    assert drive(v.answer(["take", "hook", "2", "11"]), {})[0]["next"] == "leave"
    # The controller keeps one place; it never waits.
    v = Verb(str(out), "ablate-sw-cluster-", [], now=1_800_000_010)
    v.live = 2
    assert drive(v.answer(["take", "status", "0", ""]), {})[0]["next"] == "leave"
    v.live = 1
    assert drive(v.answer(["take", "status", "0", ""]), {})[0]["entry"] == "ablate-sw-cluster-b"


def test_new_sessions_a_bad_or_live_name_ends_the_verb_and_new_arrays_live_ones_are_skipped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = sweep(tmp_path)
    (out / "waiting" / "ablate-sw-cluster-w").mkdir()
    squeue = {"squeue": Fact(0, text("squeue.sweep_jobs_and_array_tasks.txt"))}
    v = Verb(str(out), "ablate-sw-cluster-", [])
    assert drive(v.answer(["fresh", "one", "bad.name"]), squeue) == ({"exit": 2}, [])
    assert drive(v.answer(["fresh", "one", "ablate-sw-cluster-q6"]), squeue)[0] == {"exit": 1}  # a task
    assert drive(v.answer(["fresh", "one", "ablate-sw-cluster-w"]), squeue)[0] == {"exit": 1}  # it waits
    assert drive(v.answer(["fresh", "one", "ablate-sw-cluster-new"]), squeue)[0] == {}
    assert capsys.readouterr().err.splitlines() == [
        "ablate-slurm: bad job name 'bad.name'",
        "duplicate session: ablate-sw-cluster-q6 (a Slurm job of that name is pending or running, or waits)",
        "duplicate session: ablate-sw-cluster-w (a Slurm job of that name is pending or running, or waits)"]
    reply, _ = drive(v.answer(["fresh", "many", "ablate-sw-cluster-q3", "c3", "ablate-sw-cluster-x", "cx",
                               "ablate-sw-cluster-y", "cy"]), squeue)
    assert reply["fresh"] == ["1", "2"] and reply["say"] == [
        "duplicate session: ablate-sw-cluster-q3 (a Slurm job of that name is pending or running, or waits)"]
    reply, asked = drive(v.answer(["array", "0", "/hook.sh"]),
                         {"config": Fact(0, ENFORCED), "assoc": Fact(1, "")})
    assert reply.pop("puts")[1].endswith(" - none")  # sacctmgr failed: no limit known, kept a while
    assert reply == {"room": 2, "parts": 1, "why": ""} and [n.what for n in asked] == ["config", "assoc"]
    part = v.answer(["part", "0"])
    reply = drive(part, {})[0]
    assert reply["tasks"] == ["ablate-sw-cluster-x", "ablate-sw-cluster-y"] and reply["first"] == 0
    assert reply["sopts"][1] == "--array=0-1" and reply["job"].startswith("ablate-sw-cluster-x.a")


def test_kill_session_waits_for_squeue_to_forget_the_job_at_most_kill_wait(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = sweep(tmp_path)
    squeue = {"squeue": Fact(0, text("squeue.sweep_jobs_and_array_tasks.txt"))}
    v = Verb(str(out), "ablate-sw-cluster-", [])
    assert drive(v.answer(["kill", "ablate-sw-cluster-q6"]), squeue) == (
        {}, [Need("squeue", squeue_names(out), 30), Need("scancel", "13_1", 30)])
    assert drive(v.answer(["kill", "ablate-sw-cluster-zz"]), squeue)[0] == {"exit": 0}
    pauses = [drive(v.answer(["gone", "ablate-sw-cluster-q6", "1"]), squeue)[0]["pause"] for _ in range(5)]
    assert pauses == ["0.2", "0.5", "1", "2", "2"]
    assert drive(v.answer(["gone", "ablate-sw-cluster-q6", str(sa.KILL_WAIT + 1)]), squeue)[0] == {"exit": 1}
    assert "job ablate-sw-cluster-q6 still listed" in capsys.readouterr().err
    assert drive(v.answer(["gone", "ablate-sw-cluster-q7", "1"]), squeue)[0] == {"pause": ""}


def squeue_names(out: Path) -> str:
    return ",".join(sa.sweep_names(os.listdir(out)))


# --------------------------------------------------------------------------- the co-process

def test_an_answer_is_shell_code_that_keeps_every_word_as_it_was() -> None:
    reply = {"why": "it's `$(id)` | \"x\"\nnext", "tasks": ["a b", "", "c'd"], "room": 2,
             "say": ["duplicate session: q (x)"], "exit": 1}
    r = subprocess.run(["bash", "-c", shell(reply) + "; :", "x"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == "duplicate session: q (x)\n", r
    probe = shell({k: v for k, v in reply.items() if k not in ("say", "exit")})
    r = subprocess.run(["bash", "-c", probe + '; printf "%s\\0" "$why" "${#tasks[@]}" "${tasks[@]}" "$room"'],
                       capture_output=True, text=True)
    assert r.stdout.split("\0")[:-1] == [reply["why"], "3", "a b", "", "c'd", "2"], r
    assert shell({}) == ":" and shell({"return": 124}) == "return 124"


def test_the_co_process_answers_each_question_and_asks_for_what_it_needs(tmp_path: Path) -> None:
    out = sweep(tmp_path)
    to_py, from_bash = os.pipe()
    from_py, to_bash = os.pipe()
    argv = [str(out), "ablate-sw-cluster-", "--partition=main"]
    t = threading.Thread(target=serve, args=(argv, to_py, to_bash))
    t.start()
    reader = os.fdopen(from_py, "rb")

    def reply() -> str:
        got = b""
        while not got.endswith(b"\0"):
            got += reader.read(1)
        return got[:-1].decode()

    def send(*words: str) -> None:
        os.write(from_bash, b"".join(w.encode() + b"\0" for w in (str(len(words)), *words)))

    t0 = time.monotonic()
    assert reply() == ":"
    send("jobs")
    assert reply() == f"need=squeue; arg={squeue_names(out)}; secs=30"
    send("fact", "0", text("squeue.sweep_jobs_and_array_tasks.txt"), "")
    assert reply() == ":"
    send("nosuch")
    assert reply() == "return 3"  # a question it does not know: the verb fails, the process goes on
    send("recover")
    assert reply() == "drop=(); back=()"
    os.close(from_bash)
    t.join(timeout=5)
    assert not t.is_alive() and time.monotonic() - t0 < 2
    reader.close()
    os.close(to_py)
    os.close(to_bash)
