"""The runner's decisions (`ablate/remote/queue/runner.py`, its rules in `rules.py`) over files, in
milliseconds: the one queue-line grammar (the controller's and the deployed runner's verdicts on the
same hostile lines), the runner scan, estimates, the steal pick, the head deal, re-entries and
calibration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ablate.config.project import Task
from ablate.errors import QueueError
from ablate.remote.queue import calibrate, grammar, runner, serve
from ablate.remote.queue.rules import (
    SILENT_REM,
    Candidate,
    Estimates,
    HeadCell,
    Victim,
    deal_first,
    pick_steal,
    read_estimates,
    reentries,
)
from ablate.remote.queue.runner import Runner, Sweep, deal, runner_of, victims_of
from ablate.run.deploy import packaged_runner
from ablate.sweep.cells import parse_queue_text

TASKS = {"recon": 3, "det": 2}
HOSTILE = [
    "cfgs/a/ok.yaml recon",
    "cfgs/a/ok2.yaml recon 5",
    "cfgs/a/ok3.yaml\tdet\t4\tpriority=2",
    "   cfgs/a/ok4.yaml   recon   priority=-3  ",
    "",
    "   ",
    "# a comment",
    "   # indented comment recon 3",
    "cfgs/a/crlf.yaml recon 2\r",
    "cfgs/a/x.yaml recon 0",
    "cfgs/a/x.yaml recon -1",
    "cfgs/a/x.yaml recon 12345678",
    "cfgs/a/x.yaml recon 1234567",
    "cfgs/a/x.yaml recon ١٢",
    "cfgs/a/x.yaml recon 2.0",
    "cfgs/a/x.yaml recon 1e3",
    "cfgs/a/x.yaml unknown",
    "cfgs/a/x.yaml recon 2 3",
    "cfgs/a/x.yaml recon 2 priority=x",
    "cfgs/a/x.yaml recon 2 priority=1234567",
    "cfgs/a/x.yaml recon priority=1",
    "cfgs/a/x.yaml priority=1",
    "cfgs/a/x.yaml",
    "cfgs/$(rm -rf ~).yaml recon",
    "cfgs/a/`id`.yaml recon",
    "cfgs/a/'q'.yaml recon",
    'cfgs/a/"q".yaml recon',
    "cfgs/a/semi;colon.yaml recon",
    "cfgs/a/amp&.yaml recon",
    "cfgs/a/pipe|.yaml recon",
    "cfgs/a/star*.yaml recon",
    "cfgs/a/hash#x.yaml recon",
    "cfgs/a/space name.yaml recon",
    "cfgs/a/dir/ recon",
    "cfgs/a/.hidden recon",
    "cfgs/a/..yaml recon",
    "../up.yaml recon",
    "/abs/path/c.yaml recon",
    "cfgs/a/" + "n" * 129 + ".yaml recon",
    "cfgs/a/" + "n" * 128 + ".yaml recon",
    "cfgs/a/ff.yaml\x0crecon",
    "cfgs/a/vt.yaml\x0brecon",
    "cfgs/a/nbsp.yaml\xa0recon",
    "cfgs/a/nul\x00.yaml recon",
    "cfgs/a/émoji🙂.yaml recon",
    "cfgs/a/x.yaml RECON",
    "cfgs/a/x.yaml recon\x1b[31m",
    "cfgs/a/-dash.yaml recon",
    "-flag.yaml recon",
    "cfgs/a/x.tar.gz recon",
    "cfgs/a/noext recon",
    "cfgs/a/a=b,c@d+e.yaml recon",
]


def controller_verdicts(text: str) -> list[str]:
    """What `plan`/`launch` see: per line `cell NAME CFG TASK EPOCHS CAT PRIORITY`, `skip`, or
    `invalid` (parse_line refuses it)."""
    tasks = {n: Task(n, e, 1.0) for n, e in TASKS.items()}
    out = []
    for raw in grammar.split_lines(text):
        try:
            q = parse_queue_text("q", raw + "\n", tasks, Path("q.txt"))
        except QueueError:
            out.append("invalid")
            continue
        ln = q.lines[0]
        c = ln.cell
        out.append("skip" if c is None else f"cell {c.name} {c.cfg} {c.task} {c.epochs} {c.cat} {c.priority}")
    return out


class Served:
    """The deployed zipapp's `serve`, run by a real python3, as run_queue runs it (its co-process)."""

    def __init__(self, pyz: Path, root: Path, host: str = "h1", queue: str = "q") -> None:
        env = {**os.environ, "ABLATE_TASK_EPOCHS": " ".join(f"{k}={v}" for k, v in TASKS.items())}
        self.p = subprocess.Popen([sys.executable, "-S", str(pyz), "serve", str(root), host, queue, "-"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)

    asked = 0

    def ask(self, *args: str) -> tuple[list[str], int]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.asked += 1
        self.p.stdin.write("\t".join((f"q{self.asked}", *args)) + "\n")
        self.p.stdin.flush()
        rows = []
        while not (line := self.p.stdout.readline()).startswith(".done "):
            assert line, "the served runner ended without an answer"
            rows.append(line.rstrip("\n"))
        assert line.split()[2] == f"q{self.asked}"  # the answer names its request
        return rows, int(line.split()[1])

    def close(self) -> int:
        assert self.p.stdin is not None
        self.p.stdin.close()
        return self.p.wait(timeout=10)


def runner_verdicts(tmp_path: Path, text: str) -> list[str]:
    """What a run_queue sees: the deployed zipapp's `lines`, run by a real python3; and each line
    asked of it served (`line --from I`), as run_queue asks: both must say the same."""
    root = tmp_path / "root"
    (root / "queues").mkdir(parents=True)
    (root / "queues" / "q.txt").write_bytes(text.encode("utf-8", "surrogateescape"))
    pyz = tmp_path / "runner.pyz"
    pyz.write_bytes(packaged_runner())
    env = {**os.environ, "ABLATE_TASK_EPOCHS": " ".join(f"{k}={v}" for k, v in TASKS.items())}
    out = subprocess.run([sys.executable, "-S", str(pyz), "lines", str(root), "h1", "q", "-"],
                         capture_output=True, text=True, env=env, check=True).stdout.splitlines()
    assert out[-2:] == [f"n {len(out) - 2}", f"size {len(text.encode('utf-8', 'surrogateescape'))}"]
    rows = []
    for i, row in enumerate(out[:-2]):
        idx, rest = row.split(" ", 1)
        assert int(idx) == i
        rows.append(rest)
    served = Served(pyz, root)
    assert [served.ask("line", "--from", str(i)) for i in range(len(rows) + 1)] \
        == [([r], 0) for r in rows] + [(["none"], 0)]
    assert served.close() == 0
    return rows


def test_every_parser_gives_the_same_verdict_on_valid_and_hostile_lines(tmp_path: Path) -> None:
    text = "\ufeff" + "\n".join(HOSTILE) + "\nlast/no_newline.yaml det"
    ctl = controller_verdicts(text)
    assert ctl == runner_verdicts(tmp_path, text)
    # the verdicts themselves, so that a grammar that accepts everything cannot pass
    assert ctl[:4] == ["cell ok cfgs/a/ok.yaml recon 3 a 0", "cell ok2 cfgs/a/ok2.yaml recon 5 a 0",
                       "cell ok3 cfgs/a/ok3.yaml det 4 a 2", "cell ok4 cfgs/a/ok4.yaml recon 3 a -3"]
    assert ctl[4:8] == ["skip"] * 4
    assert ctl[8] == "cell crlf cfgs/a/crlf.yaml recon 2 a 0"  # CRLF ends the line: no `2\r`
    by_line = dict(zip(HOSTILE[9:], ctl[9:], strict=False))
    valid = {line for line, v in by_line.items() if v.startswith("cell")}
    assert valid == {"cfgs/a/x.yaml recon 1234567", "cfgs/a/x.yaml recon priority=1", "../up.yaml recon",
                     "/abs/path/c.yaml recon", "cfgs/a/" + "n" * 128 + ".yaml recon",
                     "cfgs/a/x.tar.gz recon", "cfgs/a/noext recon"}
    assert ctl[-1] == "cell no_newline last/no_newline.yaml det 2 last 0"


def test_split_lines_counts_lines_as_both_sides_do() -> None:
    assert grammar.split_lines("a\r\nb\rc\n\nd") == ["a", "b", "c", "", "d"]
    assert grammar.split_lines("\ufeffa\n") == ["a"]
    assert grammar.split_lines("") == []


# --------------------------------------------------------------------------- estimates

def test_estimates_rows_are_read_as_the_bash_did() -> None:
    est = read_estimates("# ablate estimates 0 declared\nhost\th1\t-\t1500\nhost\th1\t0\t500\n"
                         "host\th2\t-\t0\nover\th1\t-\t200\ncell\ta\t1000\ncell\tb\t3000\n"
                         "cell\tc\t5 extra\nhost\tbad name\t-\t1\ncell\t.x\t4\n")
    assert est.speed_of("h1", "") == 1500 and est.speed_of("h1", "0") == 500
    assert est.speed_of("h1", "1") == 1500 and est.speed_of("h2", "") == 1000  # 0 is no speed
    assert est.over_of("h1", "3") == 200 and est.over_of("h2", "") == 0
    assert est.est_of("a") == 1000 and est.est_of("zz") == 2000  # unknown: the average


# --------------------------------------------------------------------------- the runners

def hb(**kw: object) -> dict[str, object]:
    """A heartbeat as json.loads(parse_float=str, parse_int=str) gives it."""
    base: dict[str, object] = {"t": "1000.500", "state": "running", "queue": "q2", "host": "h2", "slot": None,
                               "idx": "3", "cell": "c", "cell_started": "998.000", "from_queue": None,
                               "next": "3", "deferred": ["5", "7"]}
    return {**base, **kw}


def test_a_heartbeat_is_read_as_a_runner_on_the_fs_clock() -> None:
    r = runner_of(hb(), "q1", mt=1_000_000, fs_now=1_004_000, fresh=30_000)
    assert r == Runner("q2", "h2", "", 3, "", "c", 2500 + 4000, False, 3, (5, 7))
    assert runner_of(hb(), "q2", 1, 1, 1) is None  # our own queue
    assert runner_of(hb(state="drained"), "q1", 1, 1, 1) is None
    assert runner_of(hb(host="a b"), "q1", 1, 1, 1) is None
    assert runner_of(hb(idx="x"), "q1", 1, 1, 1) is None
    silent = runner_of(hb(cell=None), "q1", mt=0, fs_now=30_000, fresh=30_000)
    assert silent is not None and silent.silent and silent.ran == -1 and silent.cell == ""
    taken = runner_of(hb(from_queue="q9", next="8"), "q1", 1, 1, 1)
    assert taken is not None and taken.own_from == 8


def test_scan_reads_the_other_runners_and_skips_its_own_and_temp_files(tmp_path: Path) -> None:
    (tmp_path / "heartbeats").mkdir()
    (tmp_path / "heartbeats" / "h2.q2").write_text(json.dumps({**hb(), "t": time.time(),
                                                              "cell_started": time.time() - 1}) + "\n")
    (tmp_path / "heartbeats" / "h1.q1").write_text(json.dumps(hb(queue="q1", host="h1")) + "\n")
    (tmp_path / "heartbeats" / ".h2.q2.123.tmp").write_text("{")
    (tmp_path / "heartbeats" / "h3.q3").write_text("not json\n")
    rs = runner.scan_runners(str(tmp_path), "h1", "q1", 10)
    assert [r.queue for r in rs] == ["q2"] and 900 <= rs[0].ran < 10_000 and not rs[0].silent


# --------------------------------------------------------------------------- the steal

def cand(idx: int, here: float, there: float, cost: float, prio: int = 0) -> Candidate:
    return Candidate(idx, f"c{idx}", prio, here, there, cost)


def test_steal_takes_from_the_latest_victim_the_line_that_minimises_the_later_finish() -> None:
    late = Victim("qa", "ha", 10_000, (cand(1, 2000, 4000, 2000), cand(2, 2000, 7000, 3000),
                                       cand(3, 2000, 10_000, 3000)))
    early = Victim("qb", "hb", 9000, (cand(1, 100, 9000, 9000),))
    # max(10000 - 2000, 2000) = 8000 for line 1, 7000 for lines 2 and 3: the later line wins the tie
    assert pick_steal([early, late]) == (1, 2)
    # nothing finishes here before there: nothing worth stealing
    assert pick_steal([Victim("qa", "ha", 5000, (cand(1, 6000, 5000, 5000),))]) is None
    # a tie at `here == there` qualifies (the victim's cell is overdue)
    assert pick_steal([Victim("qa", "ha", 5000, (cand(1, 5000, 5000, 5000),))]) == (0, 0)
    # a victim with nothing left ends the search
    assert pick_steal([Victim("qa", "ha", 0, (cand(1, 0, 0, 0),))]) is None


def test_steal_prefers_the_highest_priority_anywhere_then_min_max_in_that_victim() -> None:
    late = Victim("qa", "ha", 10_000, (cand(1, 1000, 5000, 5000), cand(2, 1000, 10_000, 5000)))
    early = Victim("qb", "hb", 8000, (cand(4, 1000, 8000, 8000, prio=2),))
    assert pick_steal([late, early]) == (1, 0)
    # equal remaining times: the queue name decides the order
    a = Victim("qb", "h", 5000, (cand(1, 100, 5000, 5000),))
    b = Victim("qa", "h", 5000, (cand(2, 100, 5000, 5000),))
    assert pick_steal([a, b]) == (1, 0)


def sweep_root(tmp_path: Path, queues: dict[str, list[str]], claimed: tuple[str, ...] = (),
               published: tuple[str, ...] = ()) -> Sweep:
    (tmp_path / "queues").mkdir(exist_ok=True)
    for q, lines in queues.items():
        (tmp_path / "queues" / f"{q}.txt").write_text("".join(line + "\n" for line in lines))
    for c in claimed:
        (tmp_path / "claims" / c).mkdir(parents=True)
    for c in published:
        (tmp_path / "final_ckpts" / c).mkdir(parents=True)
        (tmp_path / "final_ckpts" / c / "MANIFEST.json").write_text("{}")
    return Sweep(str(tmp_path), TASKS)


def run_(q: str, h: str, idx: int, cell: str = "", ran: int = -1, silent: bool = False, nxt: int = -1,
         frm: str = "", deferred: tuple[int, ...] = ()) -> Runner:
    return Runner(q, h, "", idx, frm, cell, ran, silent, nxt, deferred)


def test_victims_count_remaining_time_and_skip_taken_lines(tmp_path: Path) -> None:
    sweep = sweep_root(tmp_path, {"q2": ["c/a.yaml recon", "c/b.yaml recon", "# x", "c/c.yaml recon",
                                         "c/d.yaml recon"]}, claimed=("a", "b"), published=("c",))
    est = Estimates({("h2", "-"): 500}, {("h2", "-"): 100},
                    {"a": 1000, "b": 1000, "c": 1000, "d": 2000}, 1250)
    vs = victims_of(sweep, [run_("q2", "h2", 0, cell="a", ran=1000)], est, lambda e: e, set(), set())
    # a: 100 + 2000 - 1000 left; then d (line 4): 100 + 4000
    assert vs == [Victim("q2", "h2", 1100 + 4100, (Candidate(4, "d", 0, 2000, 5200, 4100),))]
    skipped = victims_of(sweep, [run_("q2", "h2", 0, cell="a", ran=1000)], est, lambda e: e, {"q2:4"}, set())
    assert skipped[0].cands == () and skipped[0].rem == 5200  # skipped, still counted there
    silent = victims_of(sweep, [run_("q2", "h2", 0, silent=True)], est, lambda e: e, set(), {"d"})
    assert silent == [Victim("q2", "h2", SILENT_REM, ())]  # d is the head's: never stolen


# --------------------------------------------------------------------------- the head deal

def test_deal_first_gives_each_cell_to_whoever_ends_it_first_ties_to_the_owner() -> None:
    cells = [HeadCell(4000, "big", 1, 0, 0), HeadCell(3000, "mid", 0, 0, 0), HeadCell(3000, "m2", 1, 1, 0)]
    speeds = [1000, 2000]
    t = lambda i, r: cells[i].est * 1000 // speeds[r]  # noqa: E731
    assert deal_first(cells, [0, 0], t) == 1  # big to the fast runner 1, mid to us
    assert deal_first(cells, [0, 10_000], t) == 0  # runner 1 is busy: big is ours
    # a tie goes to the owner, then to the lower runner
    assert deal_first([HeadCell(1000, "x", 1, 0, 0)], [0, 0], lambda i, r: 1000) is None
    assert deal_first([HeadCell(1000, "x", -1, 0, 0)], [0, 0], lambda i, r: 1000) == 0


def test_the_deal_over_files_and_the_head_it_reports(tmp_path: Path) -> None:
    sweep = sweep_root(tmp_path, {"q1": ["c/big1.yaml recon", "c/small1.yaml recon"],
                                  "q2": ["c/x.yaml recon", "c/big2.yaml recon", "c/big3.yaml recon"]},
                       claimed=("big3",))
    est = Estimates({("h1", "-"): 1000, ("h2", "-"): 1000}, {}, {"big1": 4000, "big2": 3000, "big3": 4000,
                                                                 "small1": 500, "x": 500}, 0)
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "h1.-").write_text("3000\n")  # h2 measured 3x faster than h1
    (tmp_path / "calib" / "h2.-").write_text("1000\n")
    r2 = run_("q2", "h2", 0, cell="x", ran=0)
    d = deal(sweep, [r2], est, ("h1", "", "q1"), 0, ())
    assert d is not None and d.on and set(d.head) == {"big1", "big2"}
    # speeds scaled to the declared sum (2000): h1 499, h2 1500; h2 is free after x (333 ms): big1
    # (ours) ends there at 2999 (here 8016), big2 there at 4999 (here 6012): nothing for us
    assert d.take == ""
    (tmp_path / "calib" / "h1.-").write_text("1000\n")  # the other way round: h1 1499, h2 500
    (tmp_path / "calib" / "h2.-").write_text("3000\n")
    d = deal(sweep, [r2], est, ("h1", "", "q1"), 0, ())
    assert d is not None and d.take == "take deal q1 h1 0 big1 c/big1.yaml recon 3 c 2668 deal"
    d = deal(sweep, [r2], est, ("h1", "", "q1"), 1, (0,))  # a line it deferred counts too
    assert d is not None and d.take.startswith("take deal q1 h1 0 big1 ")
    d = deal(sweep, [r2], est, ("h1", "", "q1"), 1, ())  # past it, not deferred: big2 is dealt
    assert d is not None and d.take == "take deal q2 h2 1 big2 c/big2.yaml recon 3 c 2001 deal"
    (tmp_path / "claims" / "big2").mkdir()
    (tmp_path / "claims" / "big1").mkdir()
    done = deal(sweep, [r2], est, ("h1", "", "q1"), 0, ())
    assert done == runner.Deal((), False, "")


def test_the_deal_says_when_a_deferred_line_goes_to_a_runner_free_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`wait` (`head_wait`): a line this runner deferred is dealt to a runner with nothing to run now,
    whose claim is a decision away; dealt to one busy with a cell, or nothing deferred, no wait."""
    sweep = sweep_root(tmp_path, {"q1": ["c/big1.yaml recon"], "q2": ["c/x.yaml recon"]})
    est = Estimates({("h1", "-"): 1000, ("h2", "-"): 1000}, {}, {"big1": 4000, "x": 500}, 0)
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "h1.-").write_text("3000\n")  # h2 3x faster: big1 is dealt to h2
    (tmp_path / "calib" / "h2.-").write_text("1000\n")
    free = run_("q2", "h2", 1, nxt=1)  # past its own lines, no cell
    busy = run_("q2", "h2", 0, cell="x", ran=0)  # x (333 ms there) first
    for other, deferred, wait in ((free, (0,), True), (busy, (0,), False), (free, (), False)):
        d = deal(sweep, [other], est, ("h1", "", "q1"), 1 if deferred else 0, deferred)
        assert d is not None and d.take == "" and d.wait is wait, (other, deferred)
    (tmp_path / "heartbeats").mkdir()  # the same through the verb: the free h2's heartbeat
    beat = hb(idx="1", cell=None, cell_started=None, next="1", deferred=[])
    (tmp_path / "heartbeats" / "h2.q2").write_text(json.dumps(beat) + "\n")
    (tmp_path / "estimates.tsv").write_text("host h1 - 1000\nhost h2 - 1000\ncell big1 4000\ncell x 500\n")
    monkeypatch.setenv("ABLATE_TASK_EPOCHS", "recon=3 det=2")
    out: list[str] = []
    argv = ["deal", str(tmp_path), "h1", "q1", "-", "--next", "1", "--deferred", "0", "--head", "1"]
    assert runner.run(argv, out.append) == 1 and out[-1] == "head_wait", out


# --------------------------------------------------------------------------- re-entries, calibration

def test_reentries_are_the_taken_cells_without_an_end_oldest_first() -> None:
    def e(ev: str, cell: str, idx: int, frm: str | None = "q1") -> dict[str, object]:
        return {"ev": ev, "cell": cell, "idx": idx, **({"from_queue": frm} if frm else {})}

    ev = [e("steal", "a", 2), e("start", "a", 2), e("steal", "b", 3), e("end", "b", 3),
          e("start", "c", 0, "q3"), e("start", "../x", 1, "q3"), e("start", "own", 1, None)]
    lines = [json.dumps(e) for e in ev] + ['{"torn": "from_queue": "']
    assert reentries(lines) == [("a", "q1", 2), ("c", "q3", 0)]


def test_calibration_waits_only_for_live_runners_that_have_neither_measured_nor_started(
        tmp_path: Path) -> None:
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "h3.-").write_text("120\n")
    rs = [run_("q2", "h2", 0), run_("q3", "h3", 0), run_("q4", "h4", 0, silent=True),
          run_("q5", "h5", 0, cell="c", ran=10)]
    assert [w for w, _ in calibrate.calib_waiting(str(tmp_path), rs)] == ["h2/q2"]


def test_the_kept_key_is_the_one_earlier_versions_computed_in_bash() -> None:
    vals = ["python bench.py --gpu {gpu}", "source /opt/conda/bin/activate", "h1", "0", "node-7",
            "0123abcd", "GPU-aaa\nGPU-bbb"]
    sha = subprocess.run(["bash", "-c", 'printf \'%s\\n\' "$@" | sha256sum', "k", *vals],
                         capture_output=True, text=True, check=True).stdout[:16]
    assert calibrate.kept_key(*vals) == sha
    assert calibrate.kept_key(*vals[:3], "", *vals[4:]) == calibrate.kept_key(*vals[:3], "-", *vals[4:])


def setting(tmp_path: Path, command: str, keep: bool = True) -> calibrate.Setting:
    root = tmp_path / "shared" / "ablate" / "sw"
    root.mkdir(parents=True, exist_ok=True)
    return calibrate.Setting(str(root), "h1", "q1", "0", command, command, "", str(tmp_path),
                             str(tmp_path / "ckpt"), 30, keep, True)


def test_a_benchmark_is_timed_kept_for_the_next_sweep_and_a_failure_is_marked(tmp_path: Path) -> None:
    said: list[str] = []
    s = setting(tmp_path, "echo warming up; echo ' 0.25 '")
    assert calibrate.measure(s, said.append) is not None
    assert calibrate.calib_ms(s.root, "h1", "0") == 250  # its last line, not its wall time
    assert "calibrating: echo warming up; echo ' 0.25 '" in said and "calibrated: 0.250s" in said
    assert (tmp_path / "ckpt" / ".calibrate.q1.log").read_text() == "warming up\n 0.25 \n"
    assert calibrate.measure(s, said.append) is None  # measured: a relaunch does nothing
    kept = list((tmp_path / "shared" / "ablate" / ".calib").iterdir())
    assert [p.read_text() for p in kept] == ["250\n"]
    nxt = s._replace(root=str(tmp_path / "shared" / "ablate" / "sw2"))  # the next sweep, same machine
    assert calibrate.measure(nxt, said.append) == ', "rc": 0, "dur": 0, "secs": 0.250, "kept": true'
    other = setting(tmp_path, "exit 3")._replace(root=str(tmp_path / "shared" / "ablate" / "sw3"))
    event = calibrate.measure(other, said.append)
    assert event is not None and event.startswith(', "rc": 3, "dur": ')
    assert Path(other.root, "calib", "h1.0").read_text() == "failed 3\n"
    assert len(list((tmp_path / "shared" / "ablate" / ".calib").iterdir())) == 1  # a failure is not kept
    sw4 = str(tmp_path / "shared" / "ablate" / "sw4")
    wall = setting(tmp_path, "sleep 0.2", keep=False)._replace(root=sw4)
    calibrate.measure(wall, said.append)
    ms = calibrate.calib_ms(wall.root, "h1", "0")
    assert ms is not None and ms >= 200  # no number printed: its wall time


@pytest.mark.parametrize("argv", [["lines", "/r", "a b", "q", "-"], ["lines", "/r", "h", "q", "x"]])
def test_the_command_line_refuses_unsafe_names(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.main(argv) == 2
    assert "bad host/queue/slot" in capsys.readouterr().err


def test_the_first_read_of_the_lines_brings_the_cut_reentries(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    sweep_root(tmp_path, {"q1": ["c/a.yaml recon", "c/b.yaml det 5"], "q2": ["c/own.yaml recon"]})
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "h2.q2.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"ev": "steal", "cell": "b", "from_queue": "q1", "idx": 1},
        {"ev": "start", "cell": "b", "from_queue": "q1", "idx": 1, "resume": 0}]))
    monkeypatch.setenv("ABLATE_TASK_EPOCHS", "recon=3 det=2")
    assert serve.main(["lines", str(tmp_path), "h2", "q2", "-", "--from", "1", "--reentries"]) == 0
    size = (tmp_path / "queues" / "q2.txt").stat().st_size
    assert capsys.readouterr().out.splitlines() == ["n 1", f"size {size}", "reenter q1 1 b c/b.yaml det 5 c"]
    assert serve.main(["lines", str(tmp_path), "h2", "q2", "-"]) == 0
    own = ["0 cell own c/own.yaml recon 3 c 0", "n 1", f"size {size}"]
    assert capsys.readouterr().out.splitlines() == own


# --------------------------------------------------------------------------- the served runner

def test_a_served_runner_answers_each_decision_sees_appends_and_ends_at_eof(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    sweep_root(tmp_path / "root", {"q": ["c/a.yaml recon", "# note"]})
    pyz = tmp_path / "runner.pyz"
    pyz.write_bytes(packaged_runner())
    s = Served(pyz, tmp_path / "root")
    assert s.ask("line", "--from", "0") == (["cell a c/a.yaml recon 3 c 0"], 0)
    assert s.ask("line", "--from", "1") == (["skip"], 0)
    assert s.ask("line", "--from", "2") == (["none"], 0)
    with open(tmp_path / "root" / "queues" / "q.txt", "a") as f:
        f.write("c/b.yaml det 4\n")  # an append, read at the next ask
    assert s.ask("line", "--from", "2") == (["cell b c/b.yaml det 4 c 0"], 0)
    assert s.ask("reentries") == ([], 0)
    assert s.ask("nonsense")[1] == 2  # refused, and it answers the next one
    assert s.ask("deal", "--next", "0", "--deferred", "") == ([], 1)  # no estimates: nothing dealt
    s.p.send_signal(15)  # the TERM that stops a cell reaches the queue's whole group: not for it
    assert s.ask("line", "--from", "0") == (["cell a c/a.yaml recon 3 c 0"], 0)
    assert s.close() == 0  # its queue's shell ended


def test_a_served_runner_parses_its_queue_again_only_when_it_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep_root(tmp_path, {"q": ["c/a.yaml recon", "c/b.yaml recon"]})
    monkeypatch.setenv("ABLATE_TASK_EPOCHS", "recon=3")
    parsed = []
    real = runner.verdict
    monkeypatch.setattr(runner, "verdict", lambda row, tasks: parsed.append(row) or real(row, tasks))
    rows: list[str] = []
    for i in (0, 1, 2, 0):
        assert serve.answer(["line", str(tmp_path), "h", "q", "-", "--from", str(i)], rows.append) == 0
    assert rows == ["cell a c/a.yaml recon 3 c 0", "cell b c/b.yaml recon 3 c 0", "none",
                    "cell a c/a.yaml recon 3 c 0"]
    assert parsed == ["c/a.yaml recon", "c/b.yaml recon"]  # once for four asks
    with open(tmp_path / "queues" / "q.txt", "a") as f:
        f.write("c/d.yaml recon\n")
    assert serve.answer(["line", str(tmp_path), "h", "q", "-", "--from", "2"], rows.append) == 0
    assert rows[-1] == "cell d c/d.yaml recon 3 c 0" and len(parsed) == 5


def test_a_served_decision_that_fails_is_answered_with_4_and_the_runner_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_root(tmp_path, {"q": ["c/a.yaml recon"]})
    monkeypatch.setattr(runner, "scan_runners", lambda *a: 1 / 0)
    rows: list[str] = []
    assert serve.answer(["deal", str(tmp_path), "h", "q", "-"], rows.append) == 4
    assert "ZeroDivisionError" in capsys.readouterr().err
    assert serve.answer(["line", str(tmp_path), "h", "q", "-"], rows.append) == 0


def _ledger(root: Path, q: str, host: str, start: int, age: float) -> None:
    path = root / "queues" / f"{q}.ledger"
    path.write_text(json.dumps({"t": 1.0, "host": host, "slot": None, "start_index": start, "lines": 3,
                                "prefix_sha256": "0" * 64, "op": "launch"}) + "\n")
    then = time.time() - age
    os.utime(path, (then, then))


def test_a_launched_queue_that_never_started_is_a_silent_victim_a_drained_runner_steals_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue whose job is still pending (a ledger older than a fresh heartbeat, no heartbeat at
    all) finishes nothing: a drained runner takes its lines from its launch's start index, through
    the claims. One launched just now, or one with a heartbeat (a live or stopped queue), is left."""
    sweep_root(tmp_path, {"q1": ["c/mine.yaml recon"], "pend": ["c/p0.yaml recon", "c/p1.yaml recon",
                                                               "c/p2.yaml recon"],
                          "fresh": ["c/f0.yaml recon"], "stopped": ["c/s0.yaml recon"]},
               claimed=("p1",))
    (tmp_path / "heartbeats").mkdir()
    (tmp_path / "heartbeats" / "cluster.stopped").write_text(json.dumps(hb(state="stopped", queue="stopped")))
    _ledger(tmp_path, "pend", "cluster", 1, age=120)
    _ledger(tmp_path, "fresh", "cluster", 0, age=0)
    _ledger(tmp_path, "stopped", "cluster", 0, age=120)
    (tmp_path / "estimates.tsv").write_text("host h1 - 1000\nhost cluster - 1000\n"
                                            "cell p0 1000\ncell p1 1000\ncell p2 1000\ncell f0 1000\n")
    monkeypatch.setenv("ABLATE_TASK_EPOCHS", "recon=3 det=2")
    out: list[str] = []
    rc = runner.run(["drained", str(tmp_path), "h1", "q1", "-", "--next", "1", "--head", "0"], out.append)
    # p0 is before its start index, p1 claimed: p2
    assert rc == 0 and out[-1].startswith("take steal pend cluster 2 p2 "), out
    got = runner.unstarted(str(tmp_path), "h1", "q1", [], 10)
    assert [(r.queue, r.host, r.idx, r.silent) for r in got] == [("pend", "cluster", 1, True)]
