"""The queue's walk (`ablate/remote/queue/walk.py`) over real files, in milliseconds: the script each step
gives run_queue, for own lines, claims lost, the head's deferral and deal, steals, re-entries, the
deferred lines taken back and the drain; and a walk made again from the position bash holds."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from ablate.remote.queue import runner, serve
from ablate.remote.queue.walk import Walk

TASKS = "recon=3 det=2"


def root_with(tmp_path: Path, queues: dict[str, list[str]]) -> Path:
    (tmp_path / "queues").mkdir()
    for q, lines in queues.items():
        (tmp_path / "queues" / f"{q}.txt").write_text("".join(line + "\n" for line in lines))
    return tmp_path


def publish(root: Path, name: str) -> None:
    (root / "final_ckpts" / name).mkdir(parents=True)
    (root / "final_ckpts" / name / "MANIFEST.json").write_text("{}\n")


def claim(root: Path, name: str, host: str, queue: str) -> None:
    (root / "claims" / name).mkdir(parents=True)
    (root / "claims" / name / "owner").write_text(f"{host} {queue} 0 1.0 - n\n")


class Decisions:
    """runner.py's real decisions; `deal` and `drained` answered from `canned` when given."""

    def __init__(self, root: Path, queue: str = "q1") -> None:
        self.base = [str(root), "h1", queue, "-"]
        self.canned: dict[str, list[str]] = {}
        self.asked: list[list[str]] = []

    def __call__(self, words: Sequence[str]) -> tuple[int, list[str]]:
        self.asked.append(list(words))
        if words[0] in self.canned:
            rows = self.canned[words[0]]
            return (0 if any(r.startswith("take ") for r in rows) else 1), rows
        out: list[str] = []
        return runner.run([words[0], *self.base, *words[1:]], out.append), out


@pytest.fixture(autouse=True)
def _tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_TASK_EPOCHS", TASKS)


def walk(root: Path, d: Decisions, head: bool = False, steal: bool = False) -> Walk:
    return Walk(str(root), "q1", d, head, steal)


def test_own_lines_in_order_skipping_comments_invalid_and_published(tmp_path: Path) -> None:
    root = root_with(tmp_path, {"q1": ["# note", "c/bad.yaml nosuchtask", "c/done.yaml recon",
                                       "c/a.yaml det 4"]})
    publish(root, "done")
    w = walk(root, Decisions(root))
    assert w.step("h1", "-") == [
        'ev skip , "idx": 1, "cell": null, "reason": "invalid"',
        "say line 1: not <cfg> <task> [epochs] with a known task; skipped",
        'ev skip , "idx": 2, "cell": "done", "reason": "done"',
        "next 3", "deferred", "ahead", "claim a 3", "run 3 a c/a.yaml det 4 c 0 -", "next 4"]
    for op in w.step("h1", "won"):  # its `ev` lines are JSON once bash puts `{"t": .., "ev": ..` first
        if op.startswith("ev "):
            json.loads('{"ev": 0' + op.split(" ", 2)[2] + "}")


def test_a_claim_lost_is_reentered_when_ours_else_skipped_as_claimed(tmp_path: Path) -> None:
    root = root_with(tmp_path, {"q1": ["c/mine.yaml recon", "c/theirs.yaml recon", "c/next.yaml recon"]})
    w = walk(root, Decisions(root))
    assert w.step("h1", "-")[-3:] == ["claim mine 0", "run 0 mine c/mine.yaml recon 3 c 0 -", "next 1"]
    claim(root, "mine", "h1", "q1")  # an earlier run of this queue's (the claim failed: it exists)
    assert w.step("h1", "lost") == ["own mine 0", "run 0 mine c/mine.yaml recon 3 c 1 -", "next 1"]
    w.idx = 1
    assert w.step("h1", "won")[-3:] == ["claim theirs 1", "run 1 theirs c/theirs.yaml recon 3 c 0 -",
                                        "next 2"]
    claim(root, "theirs", "h2", "q2")
    assert w.step("h1", "lost") == [
        'ev skip , "idx": 1, "cell": "theirs", "reason": "claimed"', "next 2",
        "next 2", "deferred", "ahead", "claim next 2", "run 2 next c/next.yaml recon 3 c 0 -", "next 3"]


def test_the_drain_ends_the_queue_or_sees_an_append(tmp_path: Path) -> None:
    root = root_with(tmp_path, {"q1": ["c/a.yaml recon"]})
    w = walk(root, Decisions(root))
    w.idx = 1
    assert w.step("h1", "-") == ["next 1", "deferred", "ahead", "drained"]
    assert w.step("h1", "drained") == ['ev queue_end , "idx": 1', "say drained at line 1", "end"]
    with open(root / "queues" / "q1.txt", "a") as f:
        f.write("c/b.yaml recon\n")
    assert w.step("h1", "drained") == ["running"]
    assert w.step("h1", "-")[-2:] == ["run 1 b c/b.yaml recon 3 c 0 -", "next 2"]


def test_a_head_cell_dealt_elsewhere_is_deferred_and_taken_back_at_the_drain(tmp_path: Path) -> None:
    root = root_with(tmp_path, {"q1": ["c/big.yaml recon", "c/small.yaml recon", "c/also.yaml recon"]})
    d = Decisions(root)
    d.canned["deal"] = ["head_on 1", "head big also"]
    w = walk(root, d, head=True)
    assert w.step("h1", "-") == ['ev defer , "idx": 0, "cell": "big"',
                                 "say line 0: big dealt to a runner expected to end it earlier; deferred",
                                 "next 1", "deferred 0", "ahead", "transition"]
    assert d.asked[-1] == ["deal", "--next", "0", "--deferred", ""]
    assert w.step("h1", "-")[-2:] == ["run 1 small c/small.yaml recon 3 c 0 -", "next 2"]  # not in the head
    w.idx = 2
    assert w.step("h1", "won")[0] == 'ev defer , "idx": 2, "cell": "also"'
    d.canned["drained"] = ["head_on 0", "head"]  # dealt out: nothing to take
    w.idx = 3
    script = w.step("h1", "-")
    assert script == ["say the shared head is dealt out", "next 3", "deferred 2", "ahead", "claim big 0",
                      "say line 0: taking back big (deferred to the head deal, still unclaimed)",
                      "run 0 big c/big.yaml recon 3 c 0 -"]
    drained = [a for a in d.asked if a[0] == "drained"]
    assert drained[-1][:5] == ["drained", "--next", "3", "--deferred", "0 2"]
    claim(root, "big", "h2", "q2")
    w.deferred = [2]
    assert w.step("h1", "lost") == [
        'ev skip , "idx": 0, "cell": "big", "reason": "claimed"', "next 3", "deferred", "ahead",
        "claim also 2", "say line 2: taking back also (deferred to the head deal, still unclaimed)",
        "run 2 also c/also.yaml recon 3 c 0 -"]


def test_a_line_deferred_a_moment_ago_is_left_to_its_taker_while_the_head_is_on(tmp_path: Path) -> None:
    """Both runners just measured: this one defers big and drains at once, while the runner big is
    dealt to, free now (the deal's `head_wait`), is a decision away from claiming it. Taking it back
    then undid the deal (the slow runner ran the big cell: test_shared_head_calibration's race).
    Within TAKE_BACK_AFTER of the deferral, the walk decides again instead (the deal first); past it,
    the line is taken back unless claimed meanwhile. A line dealt to a busy runner: at once."""
    root = root_with(tmp_path, {"q1": ["c/big.yaml recon"]})
    d = Decisions(root)
    d.canned["deal"] = ["head_on 1", "head big"]
    d.canned["drained"] = ["head_on 1", "head big", "head_wait"]  # still dealt to another, free now
    w = Walk(str(root), "q1", d, True, False, take_back_after=0.6)
    assert w.step("h1", "-")[0] == 'ev defer , "idx": 0, "cell": "big"'
    t0 = time.monotonic()
    assert w.step("h1", "-") == ["next 1", "deferred 0", "ahead"]  # no claim: decide again
    assert 0.2 <= time.monotonic() - t0 < 0.6  # a short pause between the decisions, not a spin
    claim(root, "big", "h2", "q2")  # the taker claims it; past the grace this claim of ours loses
    script = w.step("h1", "-")
    while "claim big 0" not in script and time.monotonic() - t0 < 5:
        assert script == ["next 1", "deferred 0", "ahead"]
        script = w.step("h1", "-")
    assert time.monotonic() - t0 >= 0.6 and script[-2:] == [
        "say line 0: taking back big (deferred to the head deal, still unclaimed)",
        "run 0 big c/big.yaml recon 3 c 0 -"]
    assert w.step("h1", "lost") == ['ev skip , "idx": 0, "cell": "big", "reason": "claimed"', "next 1",
                                    "deferred", "ahead", "drained"]
    (tmp_path / "busy").mkdir()
    other = root_with(tmp_path / "busy", {"q1": ["c/big.yaml recon"]})  # big unclaimed there
    d2 = Decisions(other)
    d2.canned["deal"] = ["head_on 1", "head big"]
    d2.canned["drained"] = ["head_on 1", "head big"]  # dealt to a runner busy with a cell: no wait
    busy = Walk(str(other), "q1", d2, True, False)
    assert busy.step("h1", "-")[0].startswith("ev defer ")
    t1 = time.monotonic()
    assert busy.step("h1", "-")[-1].startswith("run 0 big ") and time.monotonic() - t1 < 0.2
    fresh = Walk(str(root), "q1", d, True, False)  # a walk made again (a restarted runner) knows no
    fresh.idx, fresh.deferred = 1, [0]  # deferral time: it takes the line back at once, as before
    assert fresh.step("h1", "-")[-1].startswith("run 0 big ")


def test_an_own_head_cell_dealt_ahead_is_run_now_and_passed_over_later(tmp_path: Path) -> None:
    root = root_with(tmp_path, {"q1": ["c/a.yaml recon", "c/b.yaml recon", "c/big.yaml recon"]})
    d = Decisions(root)
    d.canned["deal"] = ["head_on 1", "head big", "take deal q1 h1 2 big c/big.yaml recon 3 c 4200 deal"]
    w = walk(root, d, head=True)
    assert w.step("h1", "-") == ["next 0", "deferred", "ahead", "claim big 2", "deferred", "ahead 2",
                                 "run 2 big c/big.yaml recon 3 c 0 -"]
    # bash holds the position: a walk made again (its process killed) goes on from it
    w2 = walk(root, Decisions(root))
    w2.idx, w2.ahead = 2, {2}
    assert w2.step("h1", "won") == ["next 3", "deferred", "ahead", "drained"]


def test_a_steal_is_claimed_recorded_and_a_lost_one_not_asked_again(tmp_path: Path) -> None:
    root = root_with(tmp_path, {"q1": ["c/a.yaml recon"], "q2": ["c/x.yaml det", "c/y.yaml det"]})
    (root / "estimates.tsv").write_text("cell\tx\t1000\n")
    publish(root, "a")
    d = Decisions(root)
    d.canned["drained"] = ["take steal q2 h2 1 y c/y.yaml det 2 c 1500 learned"]
    w = walk(root, d, steal=True)
    assert w.step("h1", "-") == [
        'ev skip , "idx": 0, "cell": "a", "reason": "done"', "next 1", "deferred", "ahead", "claim y 1",
        'ev steal , "idx": 1, "cell": "y", "from_queue": "q2", "from_host": "h2", "est": 1.500, '
        '"by": "learned"',
        "say taking y (line 1 of q2 on h2, expected 1.500s here, by learned)",
        "run 1 y c/y.yaml det 2 c 0 q2"]
    w.idx = 1
    d.canned["drained"] = []
    assert w.step("h1", "lost") == ["say lost the claim of y (line 1 of q2); looking again",
                                    "next 1", "deferred", "ahead", "drained"]
    assert d.asked[-1][-2:] == ["--skip", "q2:1"]


def test_a_stolen_cell_cut_before_its_end_is_reentered_once_with_resume(tmp_path: Path) -> None:
    root = root_with(tmp_path, {"q1": ["c/a.yaml recon"], "q2": ["c/x.yaml det", "c/y.yaml det"]})
    publish(root, "a")
    (root / "events").mkdir()
    (root / "events" / "h1.q1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"ev": "steal", "cell": "y", "from_queue": "q2", "idx": 1},
        {"ev": "start", "cell": "y", "from_queue": "q2", "idx": 1, "resume": 0}]))
    claim(root, "y", "h1", "q1")
    w = walk(root, Decisions(root))
    assert w.step("h1", "-")[-3:] == [
        "say re-entering y (line 1 of q2), stolen by this queue and cut before its end", "own y 1",
        "run 1 y c/y.yaml det 2 c 1 q2"]
    w.idx = 1
    assert w.step("h1", "-") == ["next 1", "deferred", "ahead", "drained"]  # once


def test_a_served_step_whose_deal_fails_takes_nothing_and_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Through serve's `next`, as run_queue asks: a bug in the deal is a traceback in the pane and no
    take; the line is claimed as without the head. A bug in reading the lines fails the step (4)."""
    root = root_with(tmp_path, {"q1": ["c/a.yaml recon"]})
    monkeypatch.setattr(runner, "scan_runners", lambda *a: 1 / 0)
    walks: list[Walk] = []
    rows: list[str] = []
    argv = ["next", "--at", "0", "--head", "1", "--steal", "1"]
    base = [str(root), "h1", "q1", "-"]
    assert serve.answer(argv, rows.append, step=lambda a, out: serve.step(base, walks, a, out)) == 0
    assert rows[-3:] == ["claim a 0", "run 0 a c/a.yaml recon 3 c 0 -", "next 1"]
    assert "ZeroDivisionError" in capsys.readouterr().err
    monkeypatch.setattr(runner, "own_rows", lambda *a: 1 / 0)
    assert serve.answer(argv, rows.append, step=lambda a, out: serve.step(base, walks, a, out)) == 4


def events(root: Path, *evs: dict[str, object], key: str = "h1.q1") -> None:
    (root / "events").mkdir(exist_ok=True)
    with open(root / "events" / f"{key}.jsonl", "a") as f:
        f.write("".join(json.dumps({"t": 1.0, **e}) + "\n" for e in evs))


def test_an_own_cell_is_re_entered_only_when_it_was_cut_never_when_it_ended(tmp_path: Path) -> None:
    """A restarted queue (a requeued job, a relaunch) re-enters its claimed cell only when its last
    `start` has no `end` (cut: stopped, signalled, requeued, its node lost); a cell that ended
    (crashed, OOM, too long) is remediate's: passed over, with no event after its `end`."""
    root = root_with(tmp_path, {"q1": ["c/cut.yaml recon", "c/crashed.yaml recon", "c/again.yaml recon",
                                       "c/next.yaml recon"]})
    for name in ("cut", "crashed", "again"):
        claim(root, name, "h1", "q1")
    events(root, {"ev": "start", "idx": 0, "cell": "cut", "resume": 0},
           {"ev": "queue_stop", "idx": 0, "cell": "cut", "reason": "time_limit"},
           {"ev": "start", "idx": 1, "cell": "crashed", "resume": 0},
           {"ev": "end", "idx": 1, "cell": "crashed", "rc": 1, "dur": 2.0},
           # ended once, then cut on its re-run: the last start has no end
           {"ev": "start", "idx": 2, "cell": "again", "resume": 0},
           {"ev": "end", "idx": 2, "cell": "again", "rc": 143, "dur": 2.0},
           {"ev": "start", "idx": 2, "cell": "again", "resume": 1})
    w = walk(root, Decisions(root))
    assert w.step("h1", "-")[-3:] == ["claim cut 0", "run 0 cut c/cut.yaml recon 3 c 0 -", "next 1"]
    assert w.step("h1", "lost") == ["own cut 0", "run 0 cut c/cut.yaml recon 3 c 1 -", "next 1"]
    w.idx = 1
    assert w.step("h1", "won")[-1] == "next 2"
    script = w.step("h1", "lost")
    assert script[:2] == [
        "say line 1: crashed ended with exit 1 in an earlier run of this queue; not run again here: "
        "`ablate remediate` re-runs it", "next 2"], script
    assert not any(op.startswith(("ev ", "own ", "run 1")) for op in script), script
    assert script[-3:] == ["claim again 2", "run 2 again c/again.yaml recon 3 c 0 -", "next 3"]
    assert w.step("h1", "lost") == ["own again 2", "run 2 again c/again.yaml recon 3 c 1 -", "next 3"]
    # read on from where it stopped: a later `end` of the re-entered cell is seen
    events(root, {"ev": "end", "idx": 2, "cell": "again", "rc": 124, "dur": 9.0, "reason": "no_progress"})
    w.idx = 2
    w.step("h1", "won")
    assert w.step("h1", "lost")[0].startswith("say line 2: again ended no_progress (exit 124)")
