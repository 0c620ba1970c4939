"""`ablate doctor` for a Slurm host: the client where commands run, the request itself, and the
shared FS, ckpt_root and the GPUs as the compute nodes see them.

- `slurm`: Slurm's client answers where ablate runs it (this machine, or the login node);
- `request`: `sbatch --test-only` with exactly the options every queue's job gets (partition,
  account, qos, time, gres, extra): Slurm itself says whether it would accept them;
- `job`: a small probe job (`--time=2`, one task, where the queue's jobs may run: see
  ablate/doctor/slurm_probe.py) runs the doctor's checks on a compute node (the nonce written through
  the controller's FS, the deployed wrappers' sha256, the workdir, the profile's env and python)
  and writes them to `<sweep root>/slurm/.doctor.<name>.out`; it is waited for at most
  `probe_wait()` seconds (then cancelled: "did not run within ...");
- `gpu`: with GPUs asked (`slurm.gpus`, extra's `--gpus...`), a second probe beside the first with
  those GPUs and `--time=2` runs nvidia-smi (still pending after the wait: "not checked", since the
  full request is `request`'s); without, the first probe's nvidia-smi;
- `ckpt_root`: the nonce the first probe wrote under ckpt_root is read by a third probe kept off
  that node: one directory on both, or node-local (a problem only with `resume: false`: with the
  durable resume copies a requeued job restores its cut cell's checkpoint on any node), or not
  checked (a warning without the copies);
- `longest_cell` and `time_limit`: the learned seconds of the longest planned cell against
  `time - grace` (only a trainer that resumes finishes it), and of the longest planned queue against
  `time` and `max_restarts` (relative costs say nothing about seconds, and ablate.yaml declares no
  seconds: not checked before the first cells have run);
- `array` (with `slurm.array`): the planned queues against the cluster's MaxArraySize and
  max_array_tasks (`scontrol show config`): how many arrays a launch submits, and that the
  throttle covers them.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import shlex
from collections.abc import Callable, Sequence

from ablate.config.project import Host, Project
from ablate.doctor.slurm_probe import (
    NODE_SECTION,
    ProbeJob,
    ProbeResult,
    ckpt_check,
    ckpt_read,
    ckpt_write,
    cleanup,
    gpu_options,
    node_of,
    nonce_path,
    probe_options,
    run_probes,
)
from ablate.errors import AblateError
from ablate.monitor.slurm_pending import STUCK
from ablate.plan.cost import load_model
from ablate.remote.layout import SweepLayout
from ablate.remote.slurm.adapter import array_most
from ablate.run.host_measure import Section, measure
from ablate.sweep.cells import read_all_queues
from ablate.transport import HostTransport
from ablate.util.fmt import duration

Check = tuple[str, bool, str]


def client_sections(opts: Sequence[str], name: str, array: bool = False) -> list[tuple[str, Sequence[str]]]:
    """The client's checks; with `array`, also the cluster's config (its array limits)."""
    return [("slurm", ["sinfo", "--version"]),
            ("request", ["sbatch", "--test-only", f"--job-name={name}", *opts, "--wrap", "true"]),
            *([("config", ["scontrol", "show", "config"])] if array else [])]


NodeChecks = Callable[[dict[str, Section], str | None], list[Check]]
GpuCheck = Callable[[Section | None], Check]


def slurm_checks(project: Project, host: Host, t: HostTransport,
                 node_sections: list[tuple[str, Sequence[str]]], node_checks: NodeChecks,
                 gpu_section: tuple[str, Sequence[str]], gpu_check: GpuCheck) -> list[Check]:
    """Every check of a Slurm host; `node_sections` run on a compute node inside the probe job,
    `node_checks` turns their answers (and why some are missing) into checks; `gpu_section` runs
    where the queue's GPUs are (the GPU probe, or the first one when no GPUs are asked) and
    `gpu_check` judges its answer."""
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
    try:
        out += _probes(project, host, t, name, node_sections, node_checks, gpu_section, gpu_check)
    except AblateError as e:
        out.append(("job", False, f"the probe jobs could not be submitted: {e.message}"))
    out += time_checks(project, host)
    if slurm.array:
        out.append(array_check(project, host, got.get("config")))
    return out


def _probes(project: Project, host: Host, t: HostTransport, name: str,
            node_sections: list[tuple[str, Sequence[str]]], node_checks: NodeChecks,
            gpu_section: tuple[str, Sequence[str]], gpu_check: GpuCheck) -> list[Check]:
    """The first probe (with the GPU probe beside it), then the ckpt_root probe on another node."""
    slurm = host.profile.slurm
    assert slurm is not None
    outdir = SweepLayout(project.sweep_root(host)).slurm
    token, nonce = secrets.token_hex(6), secrets.token_hex(16)
    gpu_opts = gpu_options(slurm)
    sections = [NODE_SECTION, *node_sections, *([] if gpu_opts else [gpu_section]),
                ckpt_write(host.ckpt_root, token, nonce)]
    jobs = [ProbeJob(name, tuple(probe_options(slurm)), tuple(sections))]
    if gpu_opts:
        jobs.append(ProbeJob(f"{name}-gpu", tuple(gpu_opts), (NODE_SECTION, gpu_section)))
    first, *gpu = run_probes(t, outdir, jobs)
    if first.node is None:
        out: list[Check] = [("job", False, f"the probe job ({shlex.join(first.job.opts)}) answered "
                                           f"nothing: {first.why_not()}; the compute nodes' view is not "
                                           f"checked{_output_hint(first, outdir)}")]
        return out + [gpu_verdict(r, gpu_check) for r in gpu]
    n_asked = len(node_sections) + (0 if gpu_opts else 1) + 1
    why = None if len(first.got) > n_asked else \
        f"the probe job answered {len(first.got) - 1} of {n_asked} checks"
    out = [("job", True, f"probe job ({shlex.join(first.job.opts)}) ran on {first.node}"),
           *node_checks(first.got, why)]
    out.append(gpu_verdict(gpu[0], gpu_check) if gpu else gpu_check(first.got.get("gpu")))
    out.append(_ckpt_root(project, host, t, outdir, name, token, nonce, first))
    return out


def _output_hint(r: ProbeResult, outdir: str) -> str:
    if r.timed_out or r.rc != 0:
        return ""
    return f" (is {outdir} on a filesystem the compute nodes mount at the same path?)"


def gpu_verdict(r: ProbeResult, gpu_check: GpuCheck) -> Check:
    """The GPU probe's verdict; one that could not run within the wait says so, and fails only
    when it pends for a reason that never clears by itself."""
    gres = " ".join(o for o in r.job.opts if o.startswith(("--gres", "--gpus", "-G")))
    if r.node is None:
        code = r.reason.split(",", 1)[0].strip()
        if not r.timed_out:
            return ("gpu", False, f"a probe job with {gres} and --time=2 failed: {r.why_not()}")
        if code in STUCK:
            fix = STUCK[code].format(job=r.job.name, queue="<queue>", host="<host>")
            return ("gpu", False, f"a probe job with {gres} and --time=2 will not start by itself "
                                  f"({code}): {fix}")
        return ("gpu", True, f"not checked: a probe job with {gres} and --time=2: {r.why_not()}; "
                             "Slurm accepts the full request (request), but whether its GPUs are "
                             "visible on a node is not known")
    check, ok, reason = gpu_check(r.got.get("gpu"))
    return (check, ok, f"{reason} (a probe job with {gres} on {r.node})")


def _ckpt_root(project: Project, host: Host, t: HostTransport, outdir: str, name: str, token: str,
               nonce: str, first: ProbeResult) -> Check:
    slurm = host.profile.slurm
    assert slurm is not None and first.node is not None
    w = first.got.get("ckpt")
    if w is None or w.rc != 0:
        return ckpt_check(host.ckpt_root, nonce, first, None, copies=project.resume is not None)
    node = node_of(first)
    second: ProbeResult | None = None
    why = None if node else f"the node name {first.node!r} is not one --exclude takes"
    if node:
        [second] = run_probes(t, outdir, [ProbeJob(f"{name}-ckpt", tuple(probe_options(slurm, node)),
                                                   (NODE_SECTION, ckpt_read(host.ckpt_root, token)))])
    got = ckpt_check(host.ckpt_root, nonce, first, second, why, copies=project.resume is not None)
    read = second is not None and second.got.get("ckpt") is not None and second.got["ckpt"].rc == 0
    if node and not read:  # the nonce is still on the first node
        with contextlib.suppress(AblateError):  # best effort: a tiny file in that node's ckpt_root
            cleanup(t, slurm, f"{name}-clean", node, nonce_path(host.ckpt_root, token))
    return got


def array_check(project: Project, host: Host, config: Section | None) -> Check:
    """How the planned queues of `host` go as job arrays, by the cluster's limits."""
    slurm = host.profile.slurm
    assert slurm is not None
    if config is None or config.rc != 0:
        return ("array", False, f"could not read scontrol show config: {config.last if config else '-'}")
    most = array_most(config.out)
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


def time_checks(project: Project, host: Host) -> list[Check]:
    """`longest_cell` and `time_limit`, by the learned seconds of the planned cells (ablate.yaml
    declares costs without a unit: nothing to compare before cells have run)."""
    slurm = host.profile.slurm
    limit = slurm.time_seconds if slurm else None
    if slurm is None or limit is None:
        return [("time_limit", True, "no time limit set (slurm.time): the partition's default applies")]
    model = load_model(project)
    if not model.learned:
        return [("time_limit", True, f"{slurm.time} per job; not compared with the cells and queues yet "
                                     "(costs are relative until cells have run)")]
    longest, queue = 0.0, None
    cell, cell_secs = None, 0.0
    for q in read_all_queues(project):
        if q.host != host.name:
            continue
        secs = 0.0
        for ln in q.cells:
            if ln.cell is None:
                continue
            one = model.seconds(ln.cell, host.name) or 0.0
            secs += one
            if one > cell_secs:
                cell, cell_secs = ln.cell.name, one
        if secs > longest:
            longest, queue = secs, q.name
    if queue is None:
        return [("time_limit", True, f"{slurm.time} per job; no queue planned on {host.name} yet")]
    return [_longest_cell(host, cell, cell_secs, limit), _time_limit(host, queue, longest, limit)]


def _window(host: Host, limit: int) -> tuple[int, str]:
    slurm = host.profile.slurm
    assert slurm is not None
    window = limit - slurm.grace
    return window, f"time - grace = {slurm.time} - {slurm.grace} s = {duration(window)}"


def _resubmits(host: Host) -> bool:
    slurm = host.profile.slurm
    return slurm is not None and slurm.resubmit and slurm.requeue


def _longest_cell(host: Host, cell: str | None, secs: float, limit: int) -> Check:
    window, what = _window(host, limit)
    if cell is None:
        return ("longest_cell", True, f"no planned cell on {host.name} yet")
    if secs <= window:
        return ("longest_cell", True, f"the longest planned cell, {cell}, needs about {duration(secs)}, "
                                      f"within {what}")
    over = f"{cell} needs about {duration(secs)}, more than {what}"
    if _resubmits(host):
        return ("longest_cell", True, f"warning: {over}: it finishes only if the trainer saves when "
                                      "told (TERM) and resumes from its checkpoint ({resume}) in the "
                                      "requeued job; if it cannot, raise slurm.time above "
                                      f"{duration(secs + (limit - window))}")
    return ("longest_cell", False, f"{over}, and resubmit is off: the time limit cuts it every time "
                                   f"and it never finishes: raise slurm.time above "
                                   f"{duration(secs + (limit - window))}, or set slurm.resubmit and "
                                   "slurm.requeue true with a trainer that resumes ({resume})")


def _time_limit(host: Host, queue: str, longest: float, limit: int) -> Check:
    slurm = host.profile.slurm
    assert slurm is not None
    window, what = _window(host, limit)
    if longest <= window:
        return ("time_limit", True, f"{slurm.time} per job; the longest planned queue needs about "
                                    f"{duration(longest)}")
    if not _resubmits(host):
        return ("time_limit", False, f"{queue} needs about {duration(longest)}, over {what}, and "
                                     "resubmit is off: its job ends with the queue unfinished: raise "
                                     "slurm.time, plan more queues, or set slurm.resubmit and "
                                     "slurm.requeue true")
    restarts = math.ceil(longest / window) - 1
    if restarts > slurm.max_restarts:
        return ("time_limit", False, f"{queue} needs about {duration(longest)}: {restarts} restarts of "
                                     f"its job at {what} each, more than slurm.max_restarts "
                                     f"{slurm.max_restarts}, so it would end unfinished: raise "
                                     f"slurm.max_restarts to {restarts}, raise slurm.time, or plan more "
                                     f"queues (hosts.{host.name}.queues, then ablate plan)")
    return ("time_limit", True, f"{queue} needs about {duration(longest)}, over {what}: its job will be "
                                f"requeued about {restarts} time(s) (slurm.max_restarts "
                                f"{slurm.max_restarts}), each cut cell resumed")
