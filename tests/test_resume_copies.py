"""Durable resume copies (ablate/remote/resume/): a complete checkpoint is copied to the sweep,
checked and committed last; the two newest are kept; a re-run on another instance, whose
{ckpt_dir} holds nothing, gets the newest copy that verifies, at the same paths with their mtimes
and links; a damaged or half-written copy is never restored; {resume} says what is there."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ablate.remote.queue import serve
from ablate.remote.resume import copies, keeper


def _save(ckpt: Path, step: int) -> None:
    """An HF-Trainer-like checkpoint dir: weights (safetensors) and a JSON state."""
    d = ckpt / f"checkpoint-{step}"
    d.mkdir(parents=True, exist_ok=True)
    save_file({"w": np.full(4, step, dtype=np.float32)}, str(d / "model.safetensors"))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    past = time.time_ns() - 5_000_000_000  # finished writing a while ago
    for f in d.iterdir():
        os.utime(f, ns=(past, past))
    os.utime(d, ns=(past + step, past + step))  # the newest checkpoint dir is the newest match


def _keeper(root: Path, ckpt: Path, cell: str = "c1", entries: str = "checkpoint-*") -> keeper.Keeper:
    return keeper.Keeper(str(root), cell, str(ckpt), entries, "newest", {"host": "h1", "queue": "q1"},
                         period=0.01)


def test_a_settled_checkpoint_is_committed_once_and_two_copies_are_kept(tmp_path: Path) -> None:
    root, ckpt = tmp_path / "sweep", tmp_path / "h1" / "c1"
    k = _keeper(root, ckpt)
    assert k.once(settle=True) is None  # nothing there yet
    _save(ckpt, 10)
    assert k.once(settle=True) is None  # seen once: not yet known to be complete
    first = k.once(settle=True)
    assert first is not None and first.seq == 1
    assert k.once(settle=True) is None  # the same checkpoint is not copied again
    for step in (20, 30):
        _save(ckpt, step)
        assert k.flush() is not None
    kept = copies.committed(str(root), "c1")
    assert [c.seq for c in kept] == [3, 2]  # the newest and its fallback; copy 1 removed
    rec = copies.read_record(kept[0].path)
    assert rec is not None and rec["step"] == 30 and rec["source"] == {"host": "h1", "queue": "q1"}
    assert {f["path"] for f in rec["files"]} == {"checkpoint-30/model.safetensors",
                                                 "checkpoint-30/trainer_state.json"}
    assert not [p for p in (root / "resume" / "c1").iterdir() if p.name.startswith(".")]


def test_a_checkpoint_still_being_written_is_not_committed(tmp_path: Path) -> None:
    root, ckpt = tmp_path / "sweep", tmp_path / "h1" / "c1"
    k = _keeper(root, ckpt, entries="last.ckpt")
    ckpt.mkdir(parents=True)
    for size in (10, 20, 30):  # Lightning writes `last.ckpt` in place: it grows between looks
        (ckpt / "last.ckpt").write_bytes(b"x" * size)
        assert k.once(settle=True) is None
    assert copies.committed(str(root), "c1") == []


def test_a_rerun_elsewhere_restores_the_newest_copy_with_mtimes_and_links(tmp_path: Path) -> None:
    root, ckpt = tmp_path / "sweep", tmp_path / "h1" / "c1"
    (ckpt / "ckpts").mkdir(parents=True)
    # Lightning's `save_last: link` names
    target = ckpt / "ckpts" / "epoch=3-step=120.safetensors"
    save_file({"w": np.ones(3, dtype=np.float32)}, str(target))
    (ckpt / "ckpts" / "last.safetensors").symlink_to("epoch=3-step=120.safetensors")
    os.utime(target, ns=(1_700_000_000_000_000_000,) * 2)
    k = _keeper(root, ckpt, entries="ckpts/last.safetensors")
    assert k.flush() is not None

    other = tmp_path / "h2" / "c1"  # another instance: its own disk holds nothing of the cell
    lines, event = keeper.prep(str(root), "c1", str(other), "1", "ckpts/last.safetensors", "newest", "h2 q1")
    assert lines[0].startswith("resume=1 attempt=1 ") and "step=120 " in lines[0], lines
    assert event is not None and event["from"] == "copy" and event["seq"] == 1 and event["step"] == 120
    link = other / "ckpts" / "last.safetensors"
    assert link.is_symlink() and os.readlink(link) == "epoch=3-step=120.safetensors"
    assert link.read_bytes() == target.read_bytes()
    assert (other / "ckpts" / target.name).stat().st_mtime_ns == 1_700_000_000_000_000_000
    # the same cell again on h2: its own checkpoint now, the attempt counted on
    again, event = keeper.prep(str(root), "c1", str(other), "1", "ckpts/last.safetensors", "newest",
                               "h2 q1")
    assert again[0].startswith("resume=1 attempt=2 ") and event is not None and event["from"] == "local"


def test_a_damaged_copy_is_never_restored_the_one_before_is(tmp_path: Path) -> None:
    root, ckpt = tmp_path / "sweep", tmp_path / "h1" / "c1"
    k = _keeper(root, ckpt)
    _save(ckpt, 10)
    k.flush()
    _save(ckpt, 20)
    newest = k.flush()
    assert newest is not None
    weights = Path(newest.path) / "checkpoint-20" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the sha256 finds it
    weights.write_bytes(bytes(data))
    other = tmp_path / "h2" / "c1"
    lines, event = keeper.prep(str(root), "c1", str(other), "0", "checkpoint-*", "newest", "h2 q1")
    assert lines[0].startswith("resume=1 ") and "step=10 " in lines[0], lines
    assert event is not None and event["from"] == "copy" and event["seq"] == 1
    assert "copy 2" in event["skipped"][0] and "sha256" in event["skipped"][0], event
    assert any("damaged, not restored" in ln for ln in lines[1:])
    assert sorted(p.name for p in other.iterdir()) == ["checkpoint-10"]


def test_a_half_written_copy_and_none_at_all_start_from_scratch(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    half = root / "resume" / "c1" / "1"  # a dir of the right name without its RESUME.json
    (half / "checkpoint-5").mkdir(parents=True)
    (half / "checkpoint-5" / "model.safetensors").write_bytes(b"partial")
    (root / "resume" / "c1" / ".stage.2.h1.99").mkdir()  # a copy in flight: never looked at
    lines, event = keeper.prep(str(root), "c1", str(tmp_path / "h2" / "c1"), "1", "checkpoint-*", "newest",
                               "h2 q1")
    assert lines[0].startswith("resume=0 "), lines  # an HF trainer asked to resume with nothing raises
    assert event is not None and event["from"] == "none" and "RESUME.json" in event["skipped"][0]
    fresh, event = keeper.prep(str(root), "c2", str(tmp_path / "h2" / "c2"), "0", "checkpoint-*", "newest",
                               "h2 q1")
    assert fresh[0].startswith("resume=0 attempt=1 ") and event is None and len(fresh) == 1


def test_resume_off_keeps_the_walks_value_and_the_identity_is_per_cell(tmp_path: Path) -> None:
    root = tmp_path / "ablate" / "sweepA"
    a, _ = keeper.prep(str(root), "c1", str(tmp_path / "c1"), "1", "-", "newest", "h1 q1")
    b, _ = keeper.prep(str(root), "c1", str(tmp_path / "c1"), "1", "-", "newest", "h2 q2")
    assert a[0].startswith("resume=1 attempt=1 ") and b[0].startswith("resume=1 attempt=2 ")
    ids = {ln.split("run_id=")[1].split()[0] for ln in (a[0], b[0])}
    assert len(ids) == 1 and keeper.run_id(str(root), "c2") not in ids


def test_the_served_verbs_prep_keep_end_and_drop(tmp_path: Path) -> None:
    """As run_one asks them of its queue's runner process: prep starts the keeper, a cut cell's end
    makes its last checkpoint durable, the published cell's copies go."""
    root, ckpt = tmp_path / "sweep", tmp_path / "h1" / "c1"
    ckpt.mkdir(parents=True)
    keepers = keeper.Keepers([str(root), "h1", "q1", "-"])
    out: list[str] = []
    spec = [str(ckpt), "checkpoint-*", "newest"]
    assert keepers.verb(["resume-prep", "c1", spec[0], "0", *spec[1:]], out.append) == 0
    assert out[0].startswith("resume=0 ") and "c1" in keepers.running
    _save(ckpt, 7)
    assert keepers.verb(["resume-end", "c1", "143", *spec], out.append) == 0
    assert [c.seq for c in copies.committed(str(root), "c1")] == [1] and "c1" not in keepers.running
    assert keepers.verb(["resume-drop", "c1"], out.append) == 0
    assert not (root / "resume" / "c1").exists()
    assert keepers.verb(["resume-prep", "../x", spec[0], "0", *spec[1:]], out.append) == 2
    assert keepers.verb(["resume-prep", "c1", "relative/c1", "0", *spec[1:]], out.append) == 2
    rows: list[str] = []
    assert serve.main(["resume-drop", str(root), "h1", "q1", "-", "c1"]) == 0 and not rows


def test_status_says_what_a_cut_cell_resumes_from_before_it_runs() -> None:
    from ablate.sweep.classify import CellState
    from ablate.sweep.resume_view import lines, resume_from

    cells = {"a": CellState("a", "lost", "its host stopped answering"),
             "b": CellState("b", "interrupted", "its queue was stopped"),
             "c": CellState("c", "running", "epoch 3"), "d": CellState("d", "verified", "ok"),
             "e": CellState("e", "running", "epoch 1")}
    copies_seen = {"a": [{"seq": 3, "step": 30, "top": ["trainer"], "committed": 1000.0, "made_on": "h2"},
                         {"seq": 2, "step": 20, "top": ["trainer"], "committed": 900.0, "made_on": "h2"}],
                   "c": [{"seq": 1, "step": None, "top": ["model.safetensors"], "committed": 1030.0,
                          "made_on": "h1"}],
                   "d": [{"seq": 1, "step": 5, "top": ["x"], "committed": 1.0, "made_on": "h1"}]}
    got = resume_from(copies_seen, cells, now=1240.0)
    assert got == {"a": {"from": "copy", "seq": 3, "step": 30, "what": "trainer", "age": 240.0,
                         "made_on": "h2"},
                   "b": {"from": "none"},
                   "c": {"from": "copy", "seq": 1, "step": None, "what": "model.safetensors", "age": 210.0,
                         "made_on": "h1"}}
    text = lines(got, cells)
    assert text == ["  a (lost) will resume from trainer (step 30), 4m00s old, made on h2",
                    "  b (interrupted) will start from scratch: nothing durable to resume from",
                    "  c durable so far: model.safetensors, 3m30s old, made on h1"], text
