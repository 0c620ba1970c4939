"""ablate.monitor.slurm_pending: which Slurm pending reasons never clear by themselves, and the fix named."""

from __future__ import annotations

import pytest

from ablate.monitor.slurm_pending import STUCK, stuck


@pytest.mark.parametrize(("reason", "words"), [
    ("PartitionTimeLimit", "lower slurm.time"),
    ("QOSMaxWallDurationPerJobLimit", "lower slurm.time"),
    ("InvalidAccount", "slurm.account"),
    ("ReqNodeNotAvail, UnavailableNodes:sn1", "sinfo -R"),
    ("JobHeldAdmin", "ablate stop q1 --host cluster"),
])
def test_a_reason_that_never_clears_names_the_fix(reason: str, words: str) -> None:
    got = stuck("PENDING", reason, job="41", queue="q1", host="cluster")
    assert got is not None and got.startswith(f"will not start by itself ({reason.split(',')[0]}): ")
    assert words in got


@pytest.mark.parametrize(("state", "reason"), [
    ("PENDING", "Resources"), ("PENDING", "Priority"), ("PENDING", "BeginTime"),
    ("PENDING", "QOSMaxJobsPerUserLimit"), ("PENDING", None), ("RUNNING", "JobHeldAdmin"), (None, None),
])
def test_a_reason_that_clears_as_jobs_end_is_not_flagged(state: str | None, reason: str | None) -> None:
    assert stuck(state, reason, job="41", queue="q1", host="cluster") is None


def test_every_fix_is_one_line_with_its_placeholders_filled() -> None:
    for code in STUCK:
        got = stuck("PENDING", code, job="41", queue="q1", host="cluster")
        assert got is not None and "\n" not in got and "{" not in got, code
