"""The checks `launch` refuses by and `ablate doctor` reports: the disk and inode budget (rule 5) and
code drift (the host's workdir at the controller's commit).

Both measure with the same host commands (`budget_sections`, `git_section`) and judge the answers
with the same functions (`disk_check`, `shared_check`, `inodes_check`, `commit_check`); `launch` asks
`launch_sections` in the one command it sends each host before it starts anything there, and
`launch_refusal` turns the answers into a refusal with the numbers, as doctor would report them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablate.config.project import Host, Project, parse_size
from ablate.errors import AblateError
from ablate.remote.layout import SweepLayout
from ablate.run.host_measure import Section, parse_df
from ablate.sweep.cells import QueueFile, read_all_queues
from ablate.sweep.ledger import LedgerEntry, last_host, parse_ledger
from ablate.transport import SharedFS
from ablate.util.fmt import count as fmt_count
from ablate.util.fmt import size as fmt_size


@dataclass(frozen=True)
class Check:
    check: str
    ok: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "reason": self.reason}


# --------------------------------------------------------------------------- cells and budget


@dataclass(frozen=True)
class Cells:
    per_host: Mapping[str, int]  # cell lines of the queues that name the host
    total: int  # distinct cells of the roster (they all land on the shared FS)
    error: str | None = None  # the queue files could not be read
    queues: int = 0  # queue files with cells: the most cells running at once
    published: int = 0  # cells of the roster with a result on the shared FS already


def count_cells(project: Project, fs: SharedFS | None, also: tuple[str, str] | None = None,
                ledgers: Mapping[str, Sequence[LedgerEntry]] | None = None,
                queues: Iterable[QueueFile] | None = None, published: Iterable[str] | None = None) -> Cells:
    """Cells per host from the local queue files (`queues`, already read; else read here): the
    `# ablate: host=` header names the host, else the last ledger entry (from `ledgers`, a
    snapshot's, else read from `fs` when given). `also` = (queue, host): a queue about to be
    launched there counts for that host. `published`: the cells with a result (a snapshot's; else
    `final_ckpts/` listed on `fs` when given)."""
    if queues is None:
        try:
            queues = read_all_queues(project)
        except AblateError as e:
            return Cells({}, 0, e.message)
    per_host: dict[str, int] = {}
    names: set[str] = set()
    running = 0
    for q in queues:
        names.update(ln.cell.name for ln in q.cells if ln.cell is not None)
        running += bool(q.cells)
        host = q.host or (also[1] if also and also[0] == q.name else None) or _ledger_host(fs, q, ledgers)
        if host:
            per_host[host] = per_host.get(host, 0) + len(q.cells)
    if published is None and fs is not None:
        try:
            published = fs.listdir(SweepLayout(fs.root).final)
        except (AblateError, OSError):
            published = ()
    return Cells(per_host, len(names), queues=running, published=len(names & set(published or ())))


def _ledger_host(fs: SharedFS | None, q: QueueFile,
                 ledgers: Mapping[str, Sequence[LedgerEntry]] | None) -> str | None:
    if ledgers is not None:
        return last_host(ledgers.get(q.name, ()), op="launch")
    if fs is None:
        return None
    return last_host(parse_ledger(fs.read_bytes(SweepLayout(fs.root).ledger(q.name))), op="launch")


def disk_check(project: Project, host: Host, cells: Cells, sec: Section | None) -> Check:
    b = project.budget
    if cells.error:
        return Check("disk", False, f"cannot count the cells: {cells.error}")
    n = cells.per_host.get(host.name, 0)
    need = b.ckpt_size * n + b.scratch
    df = parse_df(sec) if sec else None
    if df is None or df.free is None:
        return Check("disk", False, f"cannot measure free space at {host.ckpt_root}: "
                                    f"{sec.last if sec else 'no answer'}")
    free = df.free * 1024
    numbers = (f"need {fmt_size(need)} ({n} cell(s) x {fmt_size(b.ckpt_size)} + {fmt_size(b.scratch)} "
               f"scratch), free {fmt_size(free)} on {df.mount} (ckpt_root {host.ckpt_root})")
    if free < need:
        return Check("disk", False, f"below budget: {numbers}")
    want = project.resources.get("disk")
    if want is not None and df.total is not None:
        size = parse_size(str(want).rstrip("+"), f"{project.config_path}: resources.disk")
        if df.total * 1024 < size:
            return Check("disk", False, f"resources.disk asks for {want}; the disk at {df.mount} holds "
                                        f"{fmt_size(df.total * 1024)}")
    return Check("disk", True, numbers)


# The resume copies a running cell can hold on the shared FS at once: the two kept, one being written
COPIES_PER_RUNNING_CELL = 3


def shared_check(project: Project, host: Host, cells: Cells, sec: Section | None) -> Check:
    """`shared_disk`: the sweep root's FS has room for the results still to come and the resume
    copies of the cells running at once (ablate/remote/resume/copies.py), each `ckpt_size`. A sweep
    kept in an object store has no such disk (a bucket has no free space to measure)."""
    if project.sweep_store(host) is not None:
        return Check("shared_disk", True, "the sweep is kept in an object store: no disk to measure")
    if cells.error:
        return Check("shared_disk", False, f"cannot count the cells: {cells.error}")
    b = project.budget
    left = max(cells.total - cells.published, 0)
    copies = COPIES_PER_RUNNING_CELL * cells.queues if project.resume is not None else 0
    need = b.ckpt_size * (left + copies)
    df = parse_df(sec) if sec else None
    root = project.sweep_root(host)
    if df is None or df.free is None:
        return Check("shared_disk", False, f"cannot measure free space at {root}: "
                                           f"{sec.last if sec else 'no answer'}")
    free = df.free * 1024
    numbers = (f"need {fmt_size(need)} ({left} result(s) to come + {copies} resume copies "
               f"({COPIES_PER_RUNNING_CELL} per running cell, {cells.queues} queue(s)) x "
               f"{fmt_size(b.ckpt_size)}), free {fmt_size(free)} on {df.mount} (sweep root {root})")
    return Check("shared_disk", free >= need, numbers if free >= need else f"below budget: {numbers}")


def inodes_check(project: Project, host: Host, cells: Cells, sec: Section | None) -> Check:
    if cells.error:
        return Check("inodes", False, f"cannot count the cells: {cells.error}")
    need = cells.total * project.budget.inodes_per_cell
    df = parse_df(sec) if sec else None
    if df is None:
        return Check("inodes", False, f"cannot measure free inodes at {project.sweep_root(host)}: "
                                      f"{sec.last if sec else 'no answer'}")
    if df.free is None or not df.total:
        return Check("inodes", True, f"{df.mount} does not report inodes (need {fmt_count(need)})")
    numbers = (f"need {fmt_count(need)} ({cells.total} cell(s) x {project.budget.inodes_per_cell}), "
               f"free {fmt_count(df.free)} on {df.mount}")
    return Check("inodes", df.free >= need, numbers if df.free >= need else f"below budget: {numbers}")


def budget_sections(project: Project, host: Host) -> list[tuple[str, Sequence[str]]]:
    root = project.sweep_root(host)
    return [("disk", ["dfat", "-k", host.ckpt_root]), ("shared_disk", ["dfat", "-k", root]),
            ("inodes", ["dfat", "-i", root])]


def launch_sections(project: Project, host: Host) -> list[tuple[str, Sequence[str]]]:
    """What `launch` measures on `host` before it starts anything there, in the one command that
    also asks its tmux: the disk and inode budget and the commit (`launch_refusal` reads them)."""
    return [*budget_sections(project, host), git_section(project)]


def launch_refusal(project: Project, host: Host, got: Mapping[str, Section], why: str | None,
                   cells: Cells, ours: str | None) -> str | None:
    """None when `host` has the disk (ckpt_size x its queues' cells + scratch) and the shared FS the
    space (the results to come and the resume copies) and inodes for the roster, and its workdir
    runs the controller's commit `ours` (or either has no git); else the refusal with the numbers,
    or naming both commits. `got`, `why`: what `measure` gave for `launch_sections`."""
    budget = (disk_check(project, host, cells, got.get("disk")),
              shared_check(project, host, cells, got.get("shared_disk")),
              inodes_check(project, host, cells, got.get("inodes")))
    for check in budget:
        if not check.ok:
            return (f"{host.name}: {check.check} {check.reason}; free space or lower budget in ablate.yaml"
                    + (f" ({why})" if why else ""))
    commit = commit_check(project, host, ours, got.get("git"))
    return None if commit.ok else f"{host.name}: {commit.reason}"


# --------------------------------------------------------------------------- commit (drift)


def controller_commit(project: Project) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(project.dir), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def commit_check(project: Project, host: Host, ours: str | None, sec: Section | None) -> Check:
    if sec is None:
        return Check("commit", True, "not compared (no answer)")
    if sec.rc == 127:
        return Check("commit", True, "no git on the host: not compared")
    if sec.rc != 0:
        return Check("commit", True, f"{project.workdir} is not a git checkout there: not compared")
    theirs = sec.last
    if ours is None:
        return Check("commit", True, f"at {theirs[:12]}; the controller's {project.dir} is not a git "
                                     "checkout: not compared")
    if theirs != ours:
        return Check("commit", False, f"code drift: {project.workdir} on {host.name} is at {theirs[:12]}, "
                                      f"the controller at {ours[:12]}; bring both to one commit")
    return Check("commit", True, f"at {ours[:12]}, same as the controller")


def git_section(project: Project) -> tuple[str, Sequence[str]]:
    return ("git", ["git", "-C", project.workdir, "rev-parse", "HEAD"])
