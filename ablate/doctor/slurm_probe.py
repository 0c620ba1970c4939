"""Doctor's probe jobs on a Slurm host: small batch jobs that run checks on a compute node.

Every probe asks `--time=2` and one task (`probe_options`): it keeps the options of the queue's
job that decide *where* a job may run and drops those that decide how *much* it asks, so that on a
busy partition the scheduler backfills it into a gap within the wait, where the queue's full request
would pend for hours. What the full request gets is asked of Slurm by `sbatch --test-only`
(ablate/doctor/slurm.py); whether the queue's GPUs are visible is a probe of its own with the
GPUs and `--time=2` (`gpu_options`), so a GPU probe still pending says "not checked" for the GPUs
alone. Probes given together are submitted together (`run_probes`: one shell, each `sbatch --wait`
in the background, each waited for at most `probe_wait()` seconds, then cancelled).

`ckpt_root` must be one directory on every node: a job requeued to another node resumes its cut
cell from the checkpoint there. The first probe writes a nonce under it (`ckpt_write`); a second
probe, kept off that node with `--exclude`, reads it (`ckpt_read`) and removes it. When it cannot
run there (a one-node partition, or not within the wait) the nonce is removed by a small job pinned
to the first node that doctor does not wait for (`cleanup`, bounded by `--deadline`).
"""

from __future__ import annotations

import os
import posixpath
import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ablate.config.slurm import SlurmSettings
from ablate.run.host_measure import Section, parse, script
from ablate.transport import HostTransport

PROBE_WAIT_ENV = "ABLATE_SLURM_PROBE_WAIT"
PROBE_WAIT = 120.0  # seconds a probe may pend before it is cancelled (env ABLATE_SLURM_PROBE_WAIT)
PROBE_TIME = "2"  # minutes: what a probe's checks need, and what backfill can fit almost anywhere
# Seconds the second node looks for the nonce: a name never looked up before is in no client's
# cache (NFS asks the server), so this only covers a slow metadata server; it is short because
# `sbatch --wait` looks at a running job less and less often (a 10 s probe is seen ending ~30 s late).
CKPT_WAIT = 3
# Options of the queue's job the probe drops (extra's; ablate's own --time, --gres, --requeue and
# --signal are not taken at all): resources (how much, and so when it starts), holds and start
# times. Kept: everything else, which says where it may run (--constraint, --nodelist, --exclude,
# --reservation, --clusters is refused anyway) or changes nothing about starting (--comment, --nice).
_SIZE = ("--mem", "--mem-per-cpu", "--cpus-per-task", "--ntasks", "--ntasks-per-node",
         "--ntasks-per-core", "--ntasks-per-socket", "--nodes", "--mincpus", "--exclusive", "--tmp",
         "--licenses", "--core-spec", "--thread-spec", "--switches", "--time-min", "--hold", "--begin",
         "--sockets-per-node", "--cores-per-socket", "--threads-per-core", "--extra-node-info",
         "--overcommit", "--mail-type", "--mail-user")
# GPU options: only the GPU probe takes those that say how many GPUs; none take what comes with each.
_GPU_COUNT = ("--gpus", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket")
_GPU_EACH = ("--cpus-per-gpu", "--mem-per-gpu", "--ntasks-per-gpu", "--gpu-bind", "--gpu-freq")
_KEPT = ("--nodelist", "--exclude", "--constraint", "--reservation", "--comment", "--nice",
         "--mem-bind")  # whole names: never taken for an abbreviation of a dropped one
_SHORT_SIZE = ("-c", "-n", "-N", "-H", "-L", "-S", "-B")
_SHORT_GPU = ("-G",)


def probe_wait() -> float:
    """Seconds a probe may pend: env ABLATE_SLURM_PROBE_WAIT when a positive number, else 120."""
    try:
        v = float(os.environ.get(PROBE_WAIT_ENV, ""))
    except ValueError:
        return PROBE_WAIT
    return v if 0 < v < 1e6 else PROBE_WAIT


def _kind(word: str) -> str:
    """An `extra` word's kind: "size", "gpu" (a GPU count), "gpu-each" or "where" (kept)."""
    opt = word.split("=", 1)[0]
    if not opt.startswith("--"):
        short = word[:2]
        return "size" if short in _SHORT_SIZE else "gpu" if short in _SHORT_GPU else "where"

    def named(names: Sequence[str]) -> bool:
        # sbatch takes a unique abbreviation: `--mem-per-c` is --mem-per-cpu.
        return opt in names or (opt not in _KEPT and any(n.startswith(opt) for n in names))

    return ("gpu" if named(_GPU_COUNT) else "gpu-each" if named(_GPU_EACH) else
            "size" if named(_SIZE) else "where")


def probe_options(slurm: SlurmSettings, exclude: str | None = None) -> list[str]:
    """The probe's sbatch options: where the queue's jobs may run (partition, account and qos,
    which also decide whether Slurm takes the job at all, and extra's placement options), `--time=2`,
    one task, never requeued. `exclude`: a node to keep it off (added to extra's --exclude)."""
    out = [f"--{k}={v}" for k, v in (("partition", slurm.partition), ("account", slurm.account),
                                     ("qos", slurm.qos)) if v]
    out += [f"--time={PROBE_TIME}", "--ntasks=1", "--no-requeue"]
    excluded = [exclude] if exclude else []
    for word in slurm.extra:
        if _kind(word) != "where":
            continue
        opt = word.split("=", 1)[0]
        if exclude and opt.startswith("--exclud") and "--exclude".startswith(opt):
            excluded.append(word.split("=", 1)[1] if "=" in word else "")
        elif exclude and word.startswith("-x"):
            excluded.append(word[2:])
        else:
            out.append(word)
    if excluded:
        out.append("--exclude=" + ",".join(x for x in excluded if x))
    return out


def gpu_options(slurm: SlurmSettings) -> list[str] | None:
    """The GPU probe's options: the probe's plus the GPUs each queue's job asks (`gpus`, and
    extra's GPU counts); None when it asks none."""
    asked = ([f"--gres=gpu:{slurm.gpus}"] if slurm.gpus else []) + [w for w in slurm.extra
                                                                     if _kind(w) == "gpu"]
    return [*probe_options(slurm), *asked] if asked else None


@dataclass(frozen=True)
class ProbeJob:
    name: str  # the job's name: unique, found again by squeue and scancel
    opts: tuple[str, ...]
    sections: tuple[tuple[str, Sequence[str]], ...]  # host_measure sections; NODE_SECTION first


@dataclass(frozen=True)
class ProbeResult:
    job: ProbeJob
    rc: int  # sbatch --wait's exit (the job's), 124 when it did not end within the wait
    got: dict[str, Section]  # the sections answered
    pending: str | None  # squeue's "STATE REASON" when it was cancelled after the wait
    error: str  # sbatch's own words (a refusal), or the job's output when it answered nothing
    wait: float

    @property
    def node(self) -> str | None:
        n = self.got.get("node")
        return n.last if n is not None and n.rc == 0 and n.last else None

    @property
    def timed_out(self) -> bool:
        return self.rc == 124

    @property
    def reason(self) -> str:
        """squeue's reason of a probe cancelled after the wait ("Resources", "Priority", ...)."""
        words = (self.pending or "").split(None, 1)
        return words[1].strip() if len(words) > 1 else ""

    def why_not(self) -> str:
        """Why it answered nothing, in one line."""
        if self.timed_out:
            state = self.pending or "no longer queued"
            return (f"it did not run within {self.wait:.0f} s ({state}); cancelled (the wait is "
                    f"{PROBE_WAIT_ENV})")
        return f"sbatch exited {self.rc}: {self.error.strip()[-300:] or 'no output'}"


_ONE = (
    # one I NAME OUTPUT BODY OPTS...: submit, wait, and leave rc, squeue's word and sbatch's stderr
    # in $d/I.*; a probe still pending (or running) after the wait is cancelled.
    'one() {\n'
    '  i=$1 n=$2 p=$3 b=$4; shift 4\n'
    '  printf "%s\\n" "#!/bin/sh" "$b" | timeout "$W" sbatch --wait --quiet --job-name="$n" '
    '--output="$p" "$@" >"$d/$i.err" 2>&1\n'
    '  r=$?\n'
    '  if [ "$r" = 124 ]; then squeue -h -n "$n" -o "%T %r" >"$d/$i.q" 2>&1; scancel -n "$n"; fi\n'
    '  echo "$r" >"$d/$i.rc"\n'
    '}\n'
)


def run_probes(t: HostTransport, outdir: str, jobs: Sequence[ProbeJob],
               wait: float | None = None) -> list[ProbeResult]:
    """Submit the probes at once (one shell where Slurm's client is) and wait for all of them;
    each job's output goes to `<outdir>/.doctor.<name>.out` (removed afterwards)."""
    wait = probe_wait() if wait is None else wait
    outer = f"@@probe-{secrets.token_hex(6)}"
    inner = [f"@@ablate-{secrets.token_hex(6)}" for _ in jobs]
    paths = [posixpath.join(outdir, f".doctor.{j.name}.out") for j in jobs]
    q = shlex.quote
    lines = [f"W={int(wait)}", 'd=$(mktemp -d) || exit 1', 'trap \'rm -rf -- "$d"\' EXIT',
             f"mkdir -p -- {q(outdir)} || exit 1", _ONE]
    for i, (j, marker, path) in enumerate(zip(jobs, inner, paths, strict=True)):
        body = script(list(j.sections), marker)
        lines.append(f"one {i} {q(j.name)} {q(path)} {q(body)} {shlex.join(j.opts)} &")
    lines.append("wait")
    for i, path in enumerate(paths):
        lines.append(f'printf "%s\\n" {q(outer)}" {i} rc $(cat "$d/{i}.rc" 2>/dev/null || echo 1)"; '
                     f'printf "%s\\n" {q(outer)}" {i} q"; cat -- "$d/{i}.q" 2>/dev/null; '
                     f'printf "%s\\n" {q(outer)}" {i} err"; cat -- "$d/{i}.err" 2>/dev/null; '
                     f'printf "%s\\n" {q(outer)}" {i} out"; cat -- {q(path)} 2>/dev/null; '
                     f"rm -f -- {q(path)}")
    r = t.run(["sh", "-c", "\n".join(lines)], timeout=wait + 60)
    parts: dict[tuple[int, str], list[str]] = {}
    rcs: dict[int, int] = {}
    key: tuple[int, str] | None = None
    for line in r.stdout.splitlines():
        words = line.split(" ")
        if words[0] == outer and len(words) >= 3 and words[1].isdigit():
            key = (int(words[1]), words[2])
            parts[key] = []
            if words[2] == "rc" and len(words) == 4 and words[3].lstrip("-").isdigit():
                rcs[key[0]] = int(words[3])
        elif key is not None:
            parts[key].append(line)
    out = []
    for i, (j, marker) in enumerate(zip(jobs, inner, strict=True)):
        text = "\n".join(parts.get((i, "out"), []))
        got = parse(text, marker)
        err = "\n".join(parts.get((i, "err"), [])) or (text if not got else "")
        if (i, "rc") not in parts:  # the shell itself failed (no Slurm client, no temp dir, ...)
            err = (r.stderr or r.stdout).strip()
        pending = "\n".join(parts.get((i, "q"), [])).strip() or None
        out.append(ProbeResult(j, rcs.get(i, r.rc or 1), got, pending, err, wait))
    return out


# The node as Slurm names it (what --exclude and --nodelist take), not its hostname.
NODE_SECTION: tuple[str, Sequence[str]] = ("node", ["sh", "-c", 'echo "${SLURMD_NODENAME:-$(hostname)}"'])


# --------------------------------------------------------------------------- ckpt_root on two nodes


def nonce_path(ckpt_root: str, token: str) -> str:
    return posixpath.join(ckpt_root, f".ablate-doctor.{token}")


# $1 ckpt_root, $2 the nonce's path, $3 the nonce: written where a cell writes, and the FS type.
_WRITE = 'mkdir -p -- "$1" && printf "%s\\n" "$3" >"$2" && stat -f -c %T -- "$1"'
# $1 ckpt_root, $2 the nonce's path, $3 seconds to look: exit 0 with the FS type and the nonce
# (removed), 1 with the FS type when it is not there, 2 when ckpt_root itself is not there.
_READ = ('i=0; while [ ! -e "$2" ] && [ "$i" -lt "$3" ]; do sleep 1; i=$((i + 1)); done\n'
         'fs=$(stat -f -c %T -- "$1" 2>/dev/null) || { echo "-"; exit 2; }\n'
         'if [ -e "$2" ]; then c=$(cat -- "$2"); rm -f -- "$2"; printf "%s\\n%s\\n" "$fs" "$c"; exit 0; fi\n'
         'echo "$fs"; exit 1')


def ckpt_write(ckpt_root: str, token: str, nonce: str) -> tuple[str, Sequence[str]]:
    return ("ckpt", ["sh", "-c", _WRITE, "sh", ckpt_root, nonce_path(ckpt_root, token), nonce])


def ckpt_read(ckpt_root: str, token: str) -> tuple[str, Sequence[str]]:
    return ("ckpt", ["sh", "-c", _READ, "sh", ckpt_root, nonce_path(ckpt_root, token), str(CKPT_WAIT)])


_LOCAL_FIX = ("set ckpt_root in the profile to shared scratch: a directory every compute node mounts "
              "at the same path (a cluster's /scratch or a directory under shared_fs), not a node's "
              "local disk or /tmp; or turn durable resume copies back on (`resume: false` is set)")
_WARN = ("if ckpt_root is node-local, resume after a requeue to another node will not work (`resume: "
         "false`: no durable copies; the cut cell's checkpoint stays on the old node): make it shared "
         "scratch")
_COPIES = ("a requeued job's cut cell resumes from its durable copy on the shared FS (`resume:` copies each "
           "complete checkpoint there while the cell runs)")


def ckpt_check(ckpt_root: str, nonce: str, first: ProbeResult, second: ProbeResult | None,
               second_why: str | None = None, copies: bool = False) -> tuple[str, bool, str]:
    """`ckpt_root`: the same directory on the first probe's node and the second's. `copies`: the
    sweep makes durable resume copies (`resume:` not false), so a node-local one is no problem."""
    a = first.node or "?"
    w = first.got.get("ckpt")
    if w is None:
        return ("ckpt_root", False, f"not checked: the probe job did not answer it on {a}")
    if w.rc != 0:
        return ("ckpt_root", False, f"could not write under {ckpt_root} on the compute node {a} "
                                    f"({w.last}): every running cell writes its checkpoints there")
    if second is None or second.node is None or "ckpt" not in second.got:
        why = second_why or (second.why_not() if second else "no second probe")
        if copies:
            return ("ckpt_root", True, f"whether {ckpt_root} is the same directory on another node than "
                                       f"{a} is not checked (the probe kept off {a}: {why}); either way, "
                                       f"{_COPIES}")
        return ("ckpt_root", True, f"warning: whether {ckpt_root} is the same directory on another "
                                   f"node than {a} is not checked (the probe kept off {a}: {why}); {_WARN}")
    b = second.node
    r = second.got["ckpt"]
    lines = r.out.splitlines()
    seen = r.rc == 0 and len(lines) >= 2 and lines[1].strip() == nonce
    if seen:
        return ("ckpt_root", True, f"{ckpt_root} is one directory on {a} and {b}: a nonce written "
                                   f"there on {a} was read on {b}, so a requeued job resumes its cut "
                                   "cell on any node")
    kinds = f"{w.last or '?'} on {a}, {(lines[0] if lines else '?').strip()} on {b}"
    what = (f"{ckpt_root} does not exist on {b}" if r.rc == 2 else
            f"a nonce written to {ckpt_root} on {a} is {'missing' if r.rc == 1 else 'other bytes'} "
            f"on {b} (looked {CKPT_WAIT} s)")
    if copies:
        return ("ckpt_root", True, f"ckpt_root is node-local: {what} (filesystem {kinds}); {_COPIES}, "
                                   "restored into the new node's ckpt_root")
    return ("ckpt_root", False, f"ckpt_root is node-local: {what} (filesystem {kinds}); a job "
                                "requeued to another node would not find its cut cell's checkpoint "
                                f"and resume after a requeue fails: {_LOCAL_FIX}")


def cleanup(t: HostTransport, slurm: SlurmSettings, name: str, node: str, path: str) -> None:
    """Remove the nonce on `node` by a one-minute job pinned there, not waited for (`--deadline`:
    Slurm drops it if it cannot run within the hour). Best effort: a failure changes no check."""
    opts = [f"--{k}={v}" for k, v in (("partition", slurm.partition), ("account", slurm.account),
                                      ("qos", slurm.qos)) if v]
    argv = ["sbatch", "--quiet", f"--job-name={name}", "--output=/dev/null", "--time=1", "--ntasks=1",
            "--no-requeue", f"--nodelist={node}", "--deadline=now+1hour", *opts,
            "--wrap", f"rm -f -- {shlex.quote(path)}"]
    t.run(["sh", "-c", f"{shlex.join(argv)} >/dev/null 2>&1 || true"], timeout=60)


def node_of(result: ProbeResult) -> str | None:
    """The probe's node, when it is a plain node name (it goes into --exclude)."""
    n = result.node
    return n if n and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n) else None
