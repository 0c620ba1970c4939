"""Slurm pending reasons that never clear by themselves, and what to do about each; a job as one
line of text (`job_text`, for status and its --watch view).

A job pending for `Resources`, `Priority`, `BeginTime` or a group limit starts once others end; one
pending for a reason below waits forever, its cells `queued` while the user pays for nothing and
believes the sweep runs. `status` names it and the fix (Slurm's reason codes: `man squeue`, "JOB
REASON CODES").
"""

from __future__ import annotations

_TIME = "lower slurm.time in the profile (or ask for a partition or QOS that allows it)"
_SET = "set slurm.{key} in the profile to one `sacctmgr show assoc user=$USER` lists"
_RELAUNCH = "then `ablate stop {queue} --host {host}` and `ablate launch {queue} --host {host}`"
STUCK: dict[str, str] = {
    "JobHeldAdmin": "an administrator holds the job: ask them to release it (`scontrol release {job}`), "
                    "or " + _RELAUNCH.removeprefix("then "),
    "JobHeldUser": "the job is held (sbatch --hold or scontrol hold): `scontrol release {job}`",
    "PartitionTimeLimit": "its time limit is above the partition's MaxTime: " + _TIME,
    "QOSMaxWallDurationPerJobLimit": "its time limit is above the QOS's MaxWall: " + _TIME,
    "AssocMaxWallDurationPerJobLimit": "its time limit is above your association's MaxWall: " + _TIME,
    "PartitionNodeLimit": "it asks for more nodes than the partition allows: check slurm.extra",
    "PartitionDown": "the partition is down: ask the administrators, or set another slurm.partition",
    "PartitionInactive": "the partition is inactive: set another slurm.partition",
    "InvalidAccount": "the account is not valid for you: " + _SET.format(key="account"),
    "InvalidQOS": "the QOS is not valid for you: " + _SET.format(key="qos"),
    "QOSMaxGRESPerJob": "it asks for more GPUs than the QOS allows per job: lower slurm.gpus",
    "QOSMaxCpuPerJobLimit": "it asks for more CPUs than the QOS allows per job: check slurm.extra",
    "QOSMaxNodePerJobLimit": "it asks for more nodes than the QOS allows per job: check slurm.extra",
    "BadConstraints": "no node has the features it asks for: check --constraint in slurm.extra",
    "DependencyNeverSatisfied": "a job it depends on failed: check --dependency in slurm.extra",
    "ReqNodeNotAvail": "the nodes it needs are down, drained or reserved (`sinfo -R` says why): "
                       "check --nodelist / --constraint in slurm.extra, or wait for the administrators",
}


def stuck(state: str | None, reason: str | None, *, job: str, queue: str, host: str) -> str | None:
    """What to do about a pending job whose reason never clears by itself; None for any other job."""
    if (state or "").upper() != "PENDING" or not reason:
        return None
    code = reason.split(",", 1)[0].strip()  # `ReqNodeNotAvail, UnavailableNodes:sn1`
    fix = STUCK.get(code)
    if fix is None:
        return None
    return (f"will not start by itself ({code}): "
            + fix.format(job=job, queue=queue, host=host))


def job_text(job: dict[str, str]) -> str:
    """`41 RUNNING on sn2`, `41 PENDING (BeginTime)`, `41 FAILED on sn2 (exit 1:0)`; a queue not
    submitted: `WAITING to be submitted: <why>`, `REFUSED by sbatch: <Slurm's words>`."""
    if job.get("state") == "WAITING":
        return f"WAITING to be submitted: {job.get('reason') or 'submit limit'}"
    if job.get("state") == "REFUSED":
        return f"REFUSED by sbatch: {job.get('reason')} (stop and launch it again once fixed)"
    where = f" on {job['nodes']}" if job.get("nodes") else ""
    why = f" ({job['reason']})" if job.get("reason") and job["reason"] != "None" else ""
    if job.get("exit"):
        why = f" (exit {job['exit']})"
    return f"{job.get('id', '?')} {job.get('state', '?')}{where}{why}"
