"""`ablate doctor` for a Slurm host: the client where commands run, the request itself, and the
shared FS as the compute nodes see it.

- `slurm`: Slurm's client answers where ablate runs it (this machine, or the login node);
- `request`: `sbatch --test-only` with exactly the options every queue's job gets (partition,
  account, qos, time, gres, extra): Slurm itself says whether it would accept them;
- `job`: a tiny probe job with those options runs the doctor's checks on a compute node (the
  nonce written through the controller's FS, the deployed wrappers' sha256, the workdir, the
  profile's env and python, the GPUs) and writes them to `<sweep root>/slurm/.doctor.<token>.out`;
  it is waited for at most `PROBE_WAIT` seconds (then cancelled: "still pending: <reason>");
- `time_limit`: the longest planned queue's learned seconds against `slurm.time` (relative costs
  say nothing about seconds: not checked before the first cells have run);
- `array` (with `slurm.array`): the planned queues against the cluster's MaxArraySize and
  max_array_tasks (`scontrol show config`): how many arrays a launch submits, and that the
  throttle covers them.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import secrets
import shlex
from collections.abc import Callable, Sequence

from ablate.config.project import Host, Project
from ablate.errors import AblateError
from ablate.plan.cost import load_model
from ablate.remote.layout import SweepLayout
from ablate.run.hostcheck import Section, measure, parse, script
from ablate.sweep.cells import read_all_queues
from ablate.transport import HostTransport
from ablate.util.fmt import duration

PROBE_WAIT = float(os.environ.get("ABLATE_SLURM_PROBE_WAIT", "120"))
Check = tuple[str, bool, str]


def client_sections(opts: Sequence[str], name: str, array: bool = False) -> list[tuple[str, Sequence[str]]]:
    """The client's checks; with `array`, also the cluster's config (its array limits)."""
    return [("slurm", ["sinfo", "--version"]),
            ("request", ["sbatch", "--test-only", f"--job-name={name}", *opts, "--wrap", "true"]),
            *([("config", ["scontrol", "show", "config"])] if array else [])]


NodeChecks = Callable[[dict[str, Section], str | None], list[Check]]


def slurm_checks(project: Project, host: Host, t: HostTransport,
                 node_sections: list[tuple[str, Sequence[str]]], node_checks: NodeChecks) -> list[Check]:
    """Every check of a Slurm host; `node_sections` run on a compute node inside the probe job,
    `node_checks` turns their answers (and why some are missing) into checks."""
    slurm = host.profile.slurm
    assert slurm is not None
    opts = slurm.sbatch_options()
    token = secrets.token_hex(6)
    name = f"ablate-doctor-{project.sweep}-{token}".replace(".", "_")
    where = f"ssh {slurm.login}" if slurm.login else "this machine"
    try:
        got, why = measure(t, client_sections(opts, name, slurm.array))
    except AblateError as e:
        return [("reachable", False, e.message)]
    out: list[Check] = [("reachable", True, where)]
    cli = got.get("slurm")
    if cli is None or cli.rc != 0:
        out.append(("slurm", False, f"no working Slurm client on {where} ({cli.last if cli else why}): "
                                    "install slurm-client there, or set slurm.login to the login node"))
        return out
    out.append(("slurm", True, cli.last))
    req = got.get("request")
    ok = req is not None and req.rc == 0
    out.append(("request", ok, (f"sbatch accepts {shlex.join(opts)}: {req.last}" if ok and req else
                                f"sbatch refuses {shlex.join(opts)}: {req.last if req else why}")))
    if not ok:
        return out
    out += _probe_job(project, host, t, opts, name, node_sections, node_checks)
    out.append(time_limit(project, host))
    if slurm.array:
        out.append(array_check(project, host, got.get("config")))
    return out


def array_check(project: Project, host: Host, config: Section | None) -> Check:
    """How the planned queues of `host` go as job arrays, by the cluster's limits."""
    slurm = host.profile.slurm
    assert slurm is not None
    if config is None or config.rc != 0:
        return ("array", False, f"could not read scontrol show config: {config.last if config else '-'}")
    size = re.search(r"^MaxArraySize\s*=\s*(\d+)", config.out, re.M)
    tasks = re.search(r"^SchedulerParameters\s*=.*\bmax_array_tasks=(\d+)", config.out, re.M)
    most = min(int(size.group(1)) if size else 1001, int(tasks.group(1)) if tasks else 1 << 62)
    if most < 1:
        return ("array", False, "this cluster has job arrays off (MaxArraySize 0): set slurm.array false")
    queues = sum(1 for q in read_all_queues(project) if q.host == host.name)
    parts = math.ceil(queues / most) if queues else 0
    throttle = f", at most {slurm.throttle} running" if slurm.throttle else ""
    if slurm.throttle and parts > slurm.throttle:
        return ("array", False, f"{queues} planned queues need {parts} arrays of at most {most} tasks, "
                                f"more than throttle {slurm.throttle}: raise slurm.throttle to {parts}")
    return ("array", True, f"{queues} planned queue(s) go as {parts} array(s) of at most {most} "
                           f"tasks{throttle}")


def _probe_job(project: Project, host: Host, t: HostTransport, opts: Sequence[str], name: str,
               sections: list[tuple[str, Sequence[str]]],
               node_checks: NodeChecks) -> list[Check]:
    marker = f"@@ablate-{secrets.token_hex(6)}"
    outdir = SweepLayout(project.sweep_root(host)).slurm
    path = posixpath.join(outdir, f".doctor.{name}.out")
    body = script([("node", ["hostname"]), *sections], marker)
    submit = (f"mkdir -p -- {shlex.quote(outdir)} && printf '%s\\n' {shlex.quote('#!/bin/sh')} "
              f"{shlex.quote(body)} | timeout {int(PROBE_WAIT)} sbatch --wait --quiet "
              f"--job-name={shlex.quote(name)} --output={shlex.quote(path)} {shlex.join(opts)}; "
              f"rc=$?; if [ $rc = 124 ]; then squeue -h -n {shlex.quote(name)} -o '%T %r'; "
              f"scancel -n {shlex.quote(name)}; fi; cat -- {shlex.quote(path)} 2>/dev/null; "
              f"rm -f -- {shlex.quote(path)}; exit $rc")
    r = t.run(["sh", "-c", submit], timeout=PROBE_WAIT + 60)
    if r.rc == 124:
        state = r.stdout.strip().splitlines()[:1]
        return [("job", False, f"the probe job did not run within {PROBE_WAIT:.0f} s "
                               f"({state[0] if state else 'no longer queued'}); cancelled. The compute "
                               "nodes' view of the shared FS is not checked (ABLATE_SLURM_PROBE_WAIT)")]
    got = parse(r.stdout, marker)
    node = got.get("node")
    if node is None:
        return [("job", False, f"the probe job ran but wrote no answer to {path} (exit {r.rc}): "
                               f"{(r.stderr or r.stdout).strip()[-200:]!r} — is {outdir} on a "
                               "filesystem the compute nodes mount at the same path?")]
    why = None if len(got) > len(sections) else \
        f"the probe job answered {len(got) - 1} of {len(sections)} checks"
    return [("job", True, f"probe job ran on {node.last}"), *node_checks(got, why)]


def time_limit(project: Project, host: Host) -> Check:
    slurm = host.profile.slurm
    limit = slurm.time_seconds if slurm else None
    if slurm is None or limit is None:
        return ("time_limit", True, "no time limit set (slurm.time): the partition's default applies")
    model = load_model(project)
    if not model.learned:
        return ("time_limit", True, f"{slurm.time} per job; not compared with the queues yet (costs "
                                    "are relative until cells have run)")
    longest, queue = 0.0, None
    for q in read_all_queues(project):
        if q.host != host.name:
            continue
        secs = sum(model.seconds(ln.cell, host.name) or 0.0 for ln in q.cells if ln.cell is not None)
        if secs > longest:
            longest, queue = secs, q.name
    if queue is None or longest <= limit - slurm.grace:
        return ("time_limit", True, f"{slurm.time} per job; the longest planned queue needs about "
                                    f"{duration(longest)}")
    if slurm.resubmit and slurm.requeue:
        return ("time_limit", True, f"{queue} needs about {duration(longest)}, over {slurm.time}: its job "
                                    f"will be requeued about {int(longest // max(1, limit - slurm.grace))} "
                                    "time(s), each cell cut resumable")
    return ("time_limit", False, f"{queue} needs about {duration(longest)}, over the {slurm.time} limit, "
                                 "and resubmit is off: raise slurm.time, plan more queues, or set "
                                 "slurm.resubmit and slurm.requeue true")
