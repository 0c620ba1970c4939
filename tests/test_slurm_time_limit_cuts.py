"""A cell cut at Slurm's time limit
(`ablate/remote/slurm/time_limit_cuts.py`, the runner's verb `cut`): stopped when
its checkpoint did not change between two time-limit cuts of different attempts; only the files its
`artifacts.checkpoint` names count; the record lives in its claim."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ablate.remote.queue import runner
from ablate.remote.slurm import time_limit_cuts


@pytest.fixture
def cell(tmp_path: Path) -> Path:
    (tmp_path / "scratch" / "c1").mkdir(parents=True)
    (tmp_path / "root" / "claims" / "c1").mkdir(parents=True)
    return tmp_path / "scratch" / "c1"


def cut(tmp_path: Path, attempt: str, cell: str = "c1", ckpt_dir: str | None = None) -> tuple[int, list[str]]:
    """The verb as run_queue asks it: the spec's checkpoint dir and entries as arguments (the
    runner's process does not inherit the spec's variables)."""
    out: list[str] = []
    rc = runner.run(["cut", str(tmp_path / "root"), "cluster", "q1", "-", "--cell", cell,
                     "--attempt", attempt, "--ckpt-dir", ckpt_dir or str(tmp_path / "scratch" / cell),
                     "--checkpoint", "model.safetensors"], out.append)
    return rc, out


def test_a_checkpoint_unchanged_between_two_time_limit_cuts_is_stuck(tmp_path: Path, cell: Path) -> None:
    (cell / "model.safetensors").write_bytes(b"x" * 10)
    rc, out = cut(tmp_path, "7.0")
    assert rc == 0 and out[0].startswith("resumable "), out
    (cell / "trace.jsonl").write_text("a log that grows without progress\n")  # not the checkpoint
    rc, out = cut(tmp_path, "7.1")
    assert rc == 0 and out[0].split()[:2] == ["stuck", "7.0"], out
    record = (tmp_path / "root" / "claims" / "c1" / time_limit_cuts.RECORD).read_text().splitlines()
    assert [r.split()[:2] for r in record] == [["time_limit", "7.0"], ["time_limit", "7.1"]]


def test_a_checkpoint_that_moved_is_resumable_and_none_twice_is_stuck(tmp_path: Path, cell: Path) -> None:
    ckpt = cell / "model.safetensors"
    ckpt.write_bytes(b"x" * 10)
    assert cut(tmp_path, "7.0")[1][0].startswith("resumable")
    ckpt.write_bytes(b"y" * 12)  # the resumed run saved further on
    assert cut(tmp_path, "7.1")[1][0].startswith("resumable")
    os.utime(ckpt, ns=(1, 1))  # rewritten (a new mtime) counts as moved too
    assert cut(tmp_path, "7.2")[1][0].startswith("resumable")
    ckpt.unlink()  # a trainer that never saves: no checkpoint at both cuts
    assert cut(tmp_path, "7.3")[1] == [f"resumable {time_limit_cuts.NONE}"]
    assert cut(tmp_path, "7.4")[1] == [f"stuck 7.3 {time_limit_cuts.NONE}"]


def test_the_same_attempt_twice_is_not_stuck_and_bad_arguments_are_refused(tmp_path: Path,
                                                                           cell: Path) -> None:
    assert cut(tmp_path, "7.0")[1][0].startswith("resumable")
    assert cut(tmp_path, "7.0")[1][0].startswith("resumable")
    assert cut(tmp_path, "7.x")[0] == 2
    assert cut(tmp_path, "7.1", cell="../c1") == (2, [])
    assert cut(tmp_path, "7.1", ckpt_dir="relative/c1") == (2, [])
    assert cut(tmp_path, "7.1", ckpt_dir=str(tmp_path / "scratch" / "other")) == (2, [])


def test_a_released_claim_takes_its_record_with_it(tmp_path: Path, cell: Path) -> None:
    assert cut(tmp_path, "7.0")[1][0].startswith("resumable")
    claim = tmp_path / "root" / "claims" / "c1"
    claim.rename(tmp_path / "root" / "released")
    claim.mkdir()  # claimed again after `ablate remediate`
    assert cut(tmp_path, "9.0")[1][0].startswith("resumable")


def test_a_claim_that_cannot_be_written_is_rc_3(tmp_path: Path, cell: Path) -> None:
    (tmp_path / "root" / "claims" / "c1").rmdir()
    assert cut(tmp_path, "7.0")[0] == 3
