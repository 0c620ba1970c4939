"""The fence's decisions (ablate/remote/queue/fence.py) in milliseconds: the verdict on one read of a
claim, an absence counted only over reads that answered and only past the FS's lag, the claim read
from a real directory the way remediate leaves it, and the served runner's `watch` / `fence` verbs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ablate.remote.queue import fence
from ablate.remote.queue.fence import DOWN, Fence, Seen, Watcher, judge, read_fs
from tests.helpers.wait import wait_for

LEASE = "h1 q1 0 1764370000.123456 - box-a"
ME = ("h1", "q1")


def test_held_taken_released_gone_and_unsure() -> None:
    assert judge(LEASE, ME, Seen(LEASE), 0, 150).how == "held"
    assert judge(LEASE, ME, Seen(LEASE + "\n"), 0, 150).how == "held"  # words, not bytes
    taken = judge(LEASE, ME, Seen("h2 rq1-h2 0 1764370500.5 - box-b"), 0, 150)
    assert (taken.how, taken.by, taken.superseded) == ("taken", "h2/rq1-h2", True)
    # the same host and queue names, another claim: a queue restarted on a new box under the old name
    again = judge(LEASE, ME, Seen("h1 q1 0 1764370999.000001 - box-c"), 0, 150)
    assert (again.how, again.by) == ("taken", "h1/q1")
    released = judge(LEASE, ME, Seen(None, ("h9 q9 1 1.0 - -", LEASE)), 0, 150)
    assert (released.how, released.by) == ("released", "remediate")
    # another run's release record is not this run's
    assert judge(LEASE, ME, Seen(None, ("h1 q1 0 1.0 - box-a",)), 10, 150).how == "unsure"
    assert judge(LEASE, ME, Seen(None), 149.9, 150).how == "unsure"
    assert judge(LEASE, ME, Seen(None), 150, 150).how == "gone"
    assert judge(LEASE, ME, Seen(""), 150, 150).how == "gone"  # an empty owner is none
    assert judge(LEASE, ME, DOWN, 10_000, 150).how == "unsure"
    # no lease (the claim was not this queue's as the cell started): any line of h1/q1 is its
    assert judge(None, ME, Seen("h1 q1 4 2.0 - -"), 0, 150).how == "held"
    assert judge(None, ME, Seen("h2 q1 4 2.0 - -"), 0, 150).how == "taken"
    assert judge(None, ME, Seen(None, ("h1 q1 4 2.0 - -",)), 0, 150).how == "released"


class Reads:
    """A claim whose reads a test scripts, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.seen: Seen = Seen(LEASE)

    def __call__(self, name: str) -> Seen:
        assert name == "c1"
        return self.seen


def test_an_absence_counts_only_over_answered_reads_and_past_the_lag() -> None:
    r = Reads()
    f = Fence("c1", LEASE, ME, r, claim_wait=60, clock=lambda: r.now)
    assert f.check().how == "held"
    r.now, r.seen = 10, Seen(None)
    assert f.check().how == "unsure"  # absent since 10
    r.now = 69.9
    assert f.check().how == "unsure"
    r.now, r.seen = 70, DOWN  # the FS did not answer: the absence starts again
    assert f.check().how == "unsure"
    r.now, r.seen = 80, Seen(None)
    assert f.check().how == "unsure"
    r.now = 139
    assert f.check().how == "unsure"
    r.now = 140
    v = f.check()
    assert v.how == "gone" and f.away() == 140  # last seen held at 0
    r.seen = Seen(LEASE)  # it came back (a stale view after all): held again, absence forgotten
    assert f.check().how == "held" and f.away() == 0
    r.now, r.seen = 141, Seen(None)
    assert f.check().how == "unsure"


def test_a_fence_without_a_lease_takes_the_first_line_of_its_own_as_it() -> None:
    r = Reads()
    f = Fence("c1", None, ME, r, claim_wait=60, clock=lambda: r.now)
    assert f.check().how == "held" and f.lease == LEASE
    r.seen = Seen("h1 q1 0 1764370999.5 - box-c")  # the same names, another claim: not this run's
    assert f.check().how == "taken"


def _claim(root: Path, name: str, owner: str) -> Path:
    d = root / "claims" / name
    d.mkdir(parents=True)
    (d / "owner").write_text(owner + "\n")
    return d


def _release(root: Path, name: str, t: str) -> None:
    """As remediate releases a claim: its reason written inside, the directory renamed."""
    d = root / "claims" / name
    (d / "release.json").write_text(json.dumps({"t": float(t), "state": "lost"}) + "\n")
    (root / "released").mkdir(exist_ok=True)
    os.rename(d, root / "released" / f"{name}.{t}")


def test_read_fs_as_remediate_leaves_the_claim(tmp_path: Path) -> None:
    assert read_fs(str(tmp_path), "c1") == Seen(None, ())  # no claims/ at all
    _claim(tmp_path, "c1", LEASE)
    _claim(tmp_path, "c10", "h3 q3 0 5.0 - -")  # another cell whose name starts alike
    assert read_fs(str(tmp_path), "c1") == Seen(LEASE)
    _release(tmp_path, "c1", "1764370600.25")
    _release(tmp_path, "c10", "1764370601.5")
    seen = read_fs(str(tmp_path), "c1")
    assert seen.owner is None and seen.released == (LEASE,)
    assert judge(LEASE, ME, seen, 0, 150).how == "released"
    _claim(tmp_path, "c1", "h2 rq1-h2 0 1764370700.0 - -")  # remediate's queue claimed it anew
    assert judge(LEASE, ME, read_fs(str(tmp_path), "c1"), 0, 150).how == "taken"


def test_read_fs_of_an_unreadable_storage_concludes_nothing(tmp_path: Path) -> None:
    (tmp_path / "claims").write_text("not a directory")  # ENOTDIR: no such claim
    assert read_fs(str(tmp_path), "c1") == Seen(None, ())
    (tmp_path / "released").mkdir()
    (tmp_path / "released" / "c1.5").mkdir()
    os.symlink("owner", tmp_path / "released" / "c1.5" / "owner")  # ELOOP: an error, not an absence
    assert read_fs(str(tmp_path), "c1") == DOWN


RINGS = """
import os, signal, sys, time
n = 0
def rung(*_):
    global n
    n += 1
    open(sys.argv[1] + ".tmp", "w").write(str(n))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])  # a reader never sees it half written
signal.signal(signal.SIGUSR1, rung)
print("ready", flush=True)
time.sleep(60)
"""


def test_the_watcher_writes_the_verdict_once_and_rings_until_disarmed(tmp_path: Path) -> None:
    rings = tmp_path / "rings"
    shell = subprocess.Popen([sys.executable, "-c", RINGS, str(rings)], stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout is not None and shell.stdout.readline() == "ready\n"
        r = Reads()
        w = Watcher(ME, r, period=0.2, claim_wait=60)
        out = tmp_path / "stop" / "h1.q1.fence"
        w.arm("c1", str(out), LEASE, ring=shell.pid)
        held = w.check_now("c1")
        assert held is not None and held.how == "held" and w.check_now("other") is None
        r.seen = Seen("h2 rq1-h2 0 9.0 - -")
        wait_for(out.exists, timeout=10)
        got = json.loads(out.read_text())
        assert (got["how"], got["by"]) == ("taken", "h2/rq1-h2") and got["away"] >= 0
        out.unlink()
        wait_for(lambda: rings.exists() and int(rings.read_text()) >= 3, timeout=10)  # again and again
        assert not out.exists()  # written once
        w.disarm()
        time.sleep(0.5)  # a ring already on its way lands within this
        n = int(rings.read_text())
        time.sleep(1.0)  # five periods: no ring after the disarm
        assert int(rings.read_text()) == n
        out.write_text('{"how": "taken", "by": "h9/q9", "away": 1.0}\n')  # an earlier cell's verdict
        w.arm("c1", str(out), LEASE, ring=shell.pid)
        assert not out.exists()  # never this cell's
        w.disarm()
        assert w.check_now("c1") is None and not out.exists()
    finally:
        shell.kill()
        shell.wait()


class Served:
    """The served runner, a real process, asked one request at a time (as run_queue and run_one ask it)."""

    def __init__(self, root: Path) -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "ablate.remote.queue.serve", "serve", str(root),
                                   "h1", "q1", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, *words: str) -> list[str]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write("x\t" + "\t".join(words) + "\n")
        self.p.stdin.flush()
        rows = [self.p.stdout.readline().rstrip("\n")]
        while not rows[-1].startswith(".done"):
            rows.append(self.p.stdout.readline().rstrip("\n"))
        return rows

    def close(self) -> None:
        self.p.communicate(timeout=10)


def _serve(root: Path, *requests: str) -> list[str]:
    s = Served(root)
    try:
        return [row for r in requests for row in s.ask(*r.split("\t")[1:])]
    finally:
        s.close()


def test_served_watch_and_fence(tmp_path: Path) -> None:
    verdict = tmp_path / "local" / "h1.q1.fence"
    _claim(tmp_path, "c1", LEASE)
    _claim(tmp_path, "c2", "h2 q2 0 1.0 - -")
    got = _serve(tmp_path, f"a\twatch\tc1\t{verdict}", "b\tfence\tc1", f"c\twatch\tc2\t{verdict}",
                 "d\tfence\tc2", "e\twatch\t-", "f\twatch\tc1\trelative", "g\tfence\t../x")
    assert got[:2] == [f"lease {LEASE}", ".done 0 x"] and got[2] == ".done 0 x"
    # c2 is another queue's: not watched; and run_one's check says so
    assert got[3].startswith("watched, with no lease yet: the claim of c2 is h2 q2") and got[4] == ".done 0 x"
    assert got[5:7] == ["superseded: the claim of c2 is h2/q2's now; it does not publish", ".done 1 x"]
    assert got[7:] == [".done 0 x", ".done 2 x", ".done 2 x"]




def test_served_fence_of_a_watched_cell_released_meanwhile(tmp_path: Path) -> None:
    verdict = tmp_path / "local" / "h1.q1.fence"
    _claim(tmp_path, "c1", LEASE)
    s = Served(tmp_path)
    try:
        assert s.ask("watch", "c1", str(verdict)) == [f"lease {LEASE}", ".done 0 x"]
        assert s.ask("fence", "c1") == [".done 0 x"]
        _release(tmp_path, "c1", "1764370600.25")
        assert s.ask("fence", "c1") == [
            "superseded: the claim of c1 was released by `ablate remediate`; it does not publish",
            ".done 1 x"]
        got = json.loads(verdict.read_text())
        assert (got["how"], got["by"]) == ("released", "remediate")
        # the cell ended (killed by TERM): its `end` fields, and the verdict is gone
        [fields, done] = s.ask("watch", "-", str(verdict), "143")
        assert done == ".done 0 x" and json.loads("{" + fields[2:] + "}") == {
            "reason": "superseded", "how": "released", "by": "remediate", "away": got["away"]}
        assert not verdict.exists()
        assert s.ask("watch", "-", str(verdict), "0") == [".done 0 x"]  # nothing to say
        assert s.ask("watch", "-", str(verdict), "75") == [', "reason": "superseded"', ".done 0 x"]
    finally:
        s.close()


def test_fence_alone_without_a_lease_checks_host_and_queue(tmp_path: Path) -> None:
    from ablate.remote.queue.serve import main

    _claim(tmp_path, "c1", LEASE)
    assert main(["fence", str(tmp_path), "h1", "q1", "-", "c1"]) == 0
    _release(tmp_path, "c1", "12.5")
    assert main(["fence", str(tmp_path), "h1", "q1", "-", "c1"]) == 1
    assert main(["fence", str(tmp_path), "h2", "q2", "-", "c1"]) == 0  # not h2's run: nothing known
    assert fence.by_of("h1 q1 0") == "h1/q1" and fence.by_of("h1 ../x") == "?"
