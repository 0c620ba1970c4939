"""ablate.remote.slurm.signal_window:
the window Slurm gives a job's processes from its first signal to its KILL,
read from what scontrol and sacctmgr print (their real formats)."""

from __future__ import annotations

from collections.abc import Sequence

from ablate.remote.slurm import signal_window

CONFIG = ("Configuration data as of 2026-11-27T10:00:00\nJobRequeue              = 1\n"
          "KillWait                = 45 sec\n")
PARTITION = ("PartitionName=main AllowGroups=ALL Default=YES QoS=N/A DefaultTime=NONE GraceTime=120 "
             "Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED\n")


def fake(answers: dict[str, str | None]) -> signal_window.Run:
    def run(argv: Sequence[str]) -> str | None:
        return answers.get(argv[0] + " " + argv[-1] if argv[0] == "sacctmgr" else " ".join(argv[:2]))
    return run


def test_each_format_parses_and_a_missing_one_is_the_default() -> None:
    assert signal_window.kill_wait(CONFIG) == 45
    assert signal_window.kill_wait(None) == signal_window.KILL_WAIT == 30
    assert signal_window.partition_grace(PARTITION) == 120 and signal_window.partition_grace("") == 0
    assert signal_window.qos_grace("00:05:00\n") == 300 and signal_window.qos_grace("1-00:00:30") == 86430
    assert signal_window.qos_grace("") == 0 and signal_window.qos_grace("garbage") == 0


def test_the_window_is_the_largest_grace_plus_kill_wait() -> None:
    run = fake({"scontrol show": CONFIG, "scontrol -o": PARTITION, "sacctmgr format=GraceTime": "00:05:00"})
    env = {"SLURM_JOB_PARTITION": "main", "SLURM_JOB_QOS": "normal"}
    assert signal_window.window(env, run) == 300 + 45
    assert signal_window.window({"SLURM_JOB_PARTITION": "main"}, run) == 120 + 45
    assert signal_window.window({}, run) == 45  # scancel's: KillWait alone
    assert signal_window.window({}, fake({})) == 30  # nothing answers: Slurm's default KillWait


def test_values_from_the_environment_never_reach_a_command_unchecked() -> None:
    seen: list[Sequence[str]] = []

    def run(argv: Sequence[str]) -> str | None:
        seen.append(argv)
        return None

    signal_window.window({"SLURM_JOB_PARTITION": "main;id", "SLURM_JOB_QOS": "$(id)"}, run)
    assert [a[:2] for a in seen] == [["scontrol", "show"]]
