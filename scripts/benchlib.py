"""The benchmark scripts' one harness: a throw-away project writer, timing, medians and ratios, the
sweep's timeline as production computes it, the machine line, and writing one section of
docs/BENCHMARKS.md between its own markers (the rest of the file is kept).

Importing it puts this checkout first on sys.path, so a script's `ablate` and `tests` are this
checkout's.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from ablate.report.timeline import Timeline

REPO = Path(__file__).resolve().parent.parent
BENCH_MD = REPO / "docs" / "BENCHMARKS.md"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# =========================================================================== the machine, the version


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": str(os.cpu_count()), "cpu": model, "kernel": platform.release(),
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def measured_line(command: str) -> str:
    m = machine()
    load = os.getloadavg()[0]  # other work on the machine, which the ratios are meant to survive
    return (f"Measured {m['date']} by `{command}` on {m['nproc']} CPU(s), {m['cpu']}, "
            f"Linux {m['kernel']}, Python {m['python']}; load average {load:.1f} at the end.")


def ablate_version(paths: Sequence[str] = ("ablate",)) -> str:
    """The commit measured, and whether `paths` had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", *paths)
    return f"{rev} plus uncommitted changes in {' or '.join(p + '/' for p in paths)}" if dirty else rev


# =========================================================================== docs/BENCHMARKS.md


def write_section(key: str, lines: Sequence[str]) -> Path:
    """Replace the block between `<!-- key:start -->` and `<!-- key:end -->`, or append it."""
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    block = "\n".join([start, *lines, end]) + "\n"
    old = BENCH_MD.read_text() if BENCH_MD.exists() else "# Benchmarks\n\n"
    if start in old and end in old:
        new = old[: old.index(start)] + block + "\n" + old[old.index(end) + len(end):].lstrip("\n")
    else:
        new = old.rstrip("\n") + "\n\n" + block
    BENCH_MD.parent.mkdir(parents=True, exist_ok=True)
    BENCH_MD.write_text(new)
    return BENCH_MD


def publish(key: str, lines: Sequence[str], write: bool, echo: bool = True) -> None:
    """Print the section (unless not `echo`: the script printed its figures its own way); with
    `write`, also put it into docs/BENCHMARKS.md (`write_section`)."""
    if echo:
        print("\n".join(lines))
    if write:
        path = write_section(key, lines)
        print(f"wrote {path.relative_to(REPO)}")


# =========================================================================== medians, ratios


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def p90(xs: Sequence[float]) -> float:
    """The 90th percentile (nearest rank on the sorted values)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, -(-9 * len(s) // 10) - 1))]


def ratio(a: float, b: float) -> float:
    """a / b; NaN when either is NaN or b is 0 (a figure that is missing, not a crash)."""
    return a / b if b == b and b != 0 else float("nan")


# =========================================================================== timing


@dataclass(frozen=True)
class Samples:
    """Wall seconds of the runs of one thing, in the order they ran."""

    secs: tuple[float, ...]

    @property
    def median(self) -> float:
        return median(self.secs)


def seconds(fn: Callable[[], object]) -> float:
    """Wall seconds of one call of `fn`."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternate(ways: Mapping[str, Callable[[int], Callable[[], object]]], runs: int, *, rotate: bool = False,
              after: Callable[[str, int, float], object] | None = None) -> dict[str, Samples]:
    """`runs` rounds that each time every way once, one right after the other, so that what else
    the machine does hits them alike. `ways[w](r)` prepares way w's run in round r (untimed) and
    returns the call that is timed; `after(w, r, secs)` runs untimed after it. The ways run in the
    order given, or (`rotate`) in that order rotated by one more each round."""
    names = list(ways)
    got: dict[str, list[float]] = {w: [] for w in names}
    for r in range(max(1, runs)):
        k = r % len(names) if rotate else 0
        for w in names[k:] + names[:k]:
            call = ways[w](r)
            got[w].append(seconds(call))
            if after is not None:
                after(w, r, got[w][-1])
    return {w: Samples(tuple(xs)) for w, xs in got.items()}


def wait_until(cond: Callable[[], object], timeout: float, every: float = 0.5) -> bool:
    """Poll `cond` every `every` s until it is true (True) or `timeout` s have passed (False)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


# =========================================================================== a throw-away project


def write_project(proj: Path, sweep: str, *, train: str, artifacts: Mapping[str, Any],
                  tasks: Mapping[str, Mapping[str, Any]], hosts: Mapping[str, Mapping[str, Any]],
                  profile: str = "local", profile_settings: Mapping[str, Any] | None = None,
                  configs: Mapping[str, str] | None = None, work: Path | None = None,
                  workdir: str | None = None, queues: Mapping[str, Iterable[str]] | None = None,
                  **settings: Any) -> Path:
    """A project at `proj` as a user writes one; returns `proj`.

    - `ablate.yaml`: profile, sweep, workdir, train, artifacts, tasks, then `settings` in the order
      given (cells, costs, budget, heartbeat_secs, steal, ssh_config, calibrate, ...), then hosts;
    - `profiles/<profile>.yaml` holding `profile_settings` when given (else `profile` names a
      built-in one, such as `local`);
    - each of `configs` (name -> its text) at `configs/<name>.yaml`, and in `work` too when given
      (the workdir as this machine sees it; `workdir`, the hosts' path of it, defaults to its path);
    - each of `queues` (name -> lines) at `queues/<name>.txt` (`host_queue` puts a host header first).
    """
    proj.mkdir(parents=True, exist_ok=True)
    if profile_settings is not None:
        (proj / "profiles").mkdir(exist_ok=True)
        (proj / "profiles" / f"{profile}.yaml").write_text(yaml.safe_dump(dict(profile_settings)))
    for where in (proj, *([work] if work is not None else [])):
        for name, body in (configs or {}).items():
            (where / "configs").mkdir(parents=True, exist_ok=True)
            (where / "configs" / f"{name}.yaml").write_text(body)
    if queues is not None:
        (proj / "queues").mkdir(exist_ok=True)
        for name, lines in queues.items():
            (proj / "queues" / f"{name}.txt").write_text("".join(f"{line}\n" for line in lines))
    if workdir is None and work is not None:
        workdir = str(work)
    doc = {"profile": profile, "sweep": sweep, **({"workdir": workdir} if workdir is not None else {}),
           "train": train, "artifacts": dict(artifacts), "tasks": {k: dict(v) for k, v in tasks.items()},
           **settings, "hosts": {k: dict(v) for k, v in hosts.items()}}
    (proj / "ablate.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return proj


def host_queue(host: str, lines: Iterable[str]) -> list[str]:
    """A queue file's lines pinned to `host` (its `# ablate: host=` header first)."""
    return [f"# ablate: host={host}", *lines]


# =========================================================================== the sweep's record


def read_events(root: Path) -> list[dict[str, Any]]:
    """Every line of the sweep root's events files, file by file."""
    out: list[dict[str, Any]] = []
    for f in sorted((root / "events").glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def timeline(root: Path, speeds: Mapping[str, float]) -> Timeline:
    """The ended sweep's timeline from its events files, as `ablate report` builds it
    (`ablate.report.timeline.build_timeline`): its runs, its makespan (the first cell's start to the
    last run's end) and the lower bound (`ablate.plan.balance.lower_bound` of each cell's `dur` x
    its host's speed in `speeds`, over the machines that ran queues). No heartbeat is read: a cell
    cut short ends at its queue's next event."""
    from ablate.report.timeline import build_timeline  # 0.4 s of imports: only for who asks
    from ablate.sweep.records import Event

    events: dict[str, list[Event]] = {}
    for f in sorted((root / "events").glob("*.jsonl")):
        parsed = (Event.parse(json.loads(line)) for line in f.read_text().splitlines() if line.strip())
        events[f.stem] = [e for e in parsed if e is not None]
    now = max((e.t for evs in events.values() for e in evs if e.t is not None), default=0.0)
    return build_timeline(events, {}, speeds, {}, now)


# =========================================================================== CPU accounting


class CpuGroups:
    """Busy CPU-seconds of named process groups (cgroup v1 `cpuacct`, else v2's `cpu.stat`): a process
    put into a group (`join`) and every process it starts later count there, wherever they run, until
    `close`. `available` False (no writable cgroup here: not root, a container without it): every
    reading is NaN, nothing is moved."""

    def __init__(self, names: Sequence[str]) -> None:
        v1, v2 = Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup")
        self.v1 = (v1 / "cpuacct.usage").exists()
        base = v1 if self.v1 else v2
        self.dirs = {n: base / f"ablate-bench-{n}-{os.getpid()}" for n in names}
        self.available = self.v1 or (v2 / "cgroup.controllers").exists()
        try:
            for d in self.dirs.values():
                d.mkdir(exist_ok=True)
        except OSError:
            self.available = False

    def join(self, name: str, pid: int) -> None:
        """Put `pid` (and so its later children) into group `name`; a process gone meanwhile is skipped."""
        if self.available:
            with contextlib.suppress(ProcessLookupError):  # ESRCH: it has exited
                (self.dirs[name] / "cgroup.procs").write_text(str(pid))

    def seconds(self, name: str) -> float:
        if not self.available:
            return float("nan")
        d = self.dirs[name]
        if self.v1:
            return int((d / "cpuacct.usage").read_text()) / 1e9
        for line in (d / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        return float("nan")

    def close(self) -> None:
        """Move whatever is left back to the root group and remove the groups."""
        root = next(iter(self.dirs.values())).parent
        for d in self.dirs.values():
            try:
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (root / "cgroup.procs").write_text(pid)
                d.rmdir()
            except OSError:
                pass
