"""What the benchmark scripts share: the machine description and writing one section of
docs/BENCHMARKS.md between its own markers (the rest of the file is kept)."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_MD = REPO / "docs" / "BENCHMARKS.md"


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


def publish(key: str, lines: Sequence[str], write: bool) -> None:
    """Print the section; with `write`, also put it into docs/BENCHMARKS.md (`write_section`)."""
    print("\n".join(lines))
    if write:
        path = write_section(key, lines)
        print(f"wrote {path.relative_to(REPO)}")


def ablate_version(paths: Sequence[str] = ("ablate",)) -> str:
    """The commit measured, and whether `paths` had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", *paths)
    return f"{rev} plus uncommitted changes in {' or '.join(p + '/' for p in paths)}" if dirty else rev


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p90(xs: Sequence[float]) -> float:
    """The 90th percentile (nearest rank on the sorted values)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, -(-9 * len(s) // 10) - 1))]


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
