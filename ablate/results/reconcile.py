"""`ablate reconcile`: the roster (every cell line of every queue file) against the results (rule 6).

By default the results are the pulled local copies (`<project>/results/<sweep>/<name>/`); with
`fs=True` the durable copies on the shared FS, verified next to the files in one probe round trip.
Each cell lands in one of:
  verified    its one result dir holds every artifact, matching MANIFEST.json by size and sha256,
              each loading (unless load=False), made from this roster's (cfg, task, epochs) and
              from the config file as it is now;
  missing     no `<name>/` result dir;
  zero_byte   a checkpoint, metrics or manifest file of 0 bytes;
  corrupt     anything else wrong, one entry per file: a missing file, a size or hash that differs
              from MANIFEST.json, a load error, a MANIFEST for another (cfg, task, epochs), or
              "stale: config changed since the result was made" (file = the cfg path);
  duplicates  more than one candidate result for the cell: besides `<name>/`, a leftover
              `.staging.<name>.<host>.<pid>/` (a second sync of a cell that already has a result)
              or a dir whose name differs only by case (merged into one on a case-insensitive
              disk, e.g. when pulled to a Mac). A duplicate is not counted as verified.
`unexpected` lists result dirs whose name is no roster cell (case variants included); they do not
block completeness. complete = the roster is non-empty and every roster cell is verified.

Every run records `gate/reconcile.json` on the shared FS, the evidence `ablate release` checks.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.remote.checkpoints import verify
from ablate.remote.layout import MANIFEST, SweepLayout
from ablate.results.common import artifacts_arg, checkpoint_checks, default_results_dir
from ablate.sweep.cells import Cell, Roster
from ablate.sweep.classify import (
    CellState,
    Verification,
    cell_lines,
    check_counts,
    collect,
    count_line,
    counts_text,
    sweep_roster,
)
from ablate.transport import shared_fs
from ablate.util.fmt import Log
from ablate.util.progress import steps

STALE = "stale: config changed since the result was made"


@dataclass
class ReconcileReport:
    roster: int
    verified: int
    complete: bool
    missing: list[str] = field(default_factory=list)
    zero_byte: list[str] = field(default_factory=list)
    corrupt: list[dict[str, str]] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    source: str = "local"  # local | fs
    results_dir: str = ""
    load: bool = True
    results_exist: bool = True
    duplicate_dirs: dict[str, list[str]] = field(default_factory=dict)
    record: str = ""
    # ablate.sweep.classify's state of every cell that is not verified (from the FS and the hosts' tmux,
    # read only when incomplete), a count per state, and why classification could not run.
    cell_states: dict[str, CellState] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    classify_error: str | None = None
    # How each file of each verified cell was checked (verify's `checks`: loaded / structure / hash /
    # size), and how many of their checkpoint files each way, strongest first.
    checked: dict[str, dict[str, str]] = field(default_factory=dict)
    checkpoint_checks: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The contract shape of `reconcile --json` (DESIGN.md), then what the issues added."""
        return {
            "roster": self.roster, "verified": self.verified, "complete": self.complete,
            "missing": self.missing, "zero_byte": self.zero_byte, "corrupt": self.corrupt,
            "duplicates": self.duplicates, "unexpected": self.unexpected,
            "states": self.states, "cells": {n: c.to_json() for n, c in self.cell_states.items()},
            "checked": self.checked, "checkpoint_checks": self.checkpoint_checks,
        }

    def checks_line(self) -> list[str]:
        """`verified by: loaded 12 checkpoint files, structure 8, hash 1` (none verified: nothing)."""
        counts = self.checkpoint_checks
        return [f"verified by: {counts_text(counts, 'checkpoint files')}"] if counts else []

    def lines(self) -> list[str]:
        how = "size+hash only, not loaded" if not self.load else \
            "loaded" if set(self.checkpoint_checks) <= {"loaded"} else "checked as `verified by:` says"
        where = "shared FS" if self.source == "fs" else "local copies"
        summary = f"{self.verified}/{self.roster} cells verified ({how}; {where} in {self.results_dir})"
        if self.complete:
            out = [summary, *self.checks_line()]
            out += [f"unexpected: {n} (result dir not in the roster)" for n in self.unexpected]
            return out
        out = []
        if not self.results_exist:
            hint = "run `ablate pull` first" if self.source == "local" else "no cell has synced yet"
            out.append(f"no results in {self.results_dir}: {hint}")
        if self.roster == 0:
            out.append("the roster is empty: no cell lines in queues/*.txt; "
                       "run `ablate plan` or write a queue")
        out += [f"missing: {n}" for n in self.missing]
        out += [f"zero-byte: {n}" for n in self.zero_byte]
        out += [f"corrupt: {c['name']}: {c['file'] or '-'}: {c['error']}" for c in self.corrupt]
        out += [f"duplicate: {n} ({', '.join(self.duplicate_dirs.get(n, []))})" for n in self.duplicates]
        out += [f"unexpected: {n} (result dir not in the roster)" for n in self.unexpected]
        if self.states:
            out.append(count_line(self.states))
            out += cell_lines(list(self.cell_states.values()))
        if self.classify_error:
            out.append(f"cell states not classified: {self.classify_error}")
        out += self.checks_line()
        out.append(f"{summary}: INCOMPLETE")
        return out


def reconcile(project: Project, fs: bool = False, host: str | None = None, load: bool = True,
              results_dir: Path | str | None = None, log: Log | None = None) -> ReconcileReport:
    """Compare the roster with the results, record gate/reconcile.json, return the report.

    An incomplete reconcile is a report, not an exception: the CLI maps `complete` to the exit code.
    """
    say = log or (lambda _m: None)
    if host is not None:
        if not fs:
            raise AblateError("--host goes with --fs (the host that reads the shared FS)")
        project.host(host)  # unknown host: ConfigError, exit 2
    if fs and results_dir is not None:
        raise AblateError("results_dir is for local copies; --fs verifies final_ckpts/ on the shared FS")
    sfs = shared_fs(project, via=host)
    roster = sweep_roster(project, sfs, log)
    layout = SweepLayout(sfs.root)
    args: dict[str, Any] = {"artifacts": artifacts_arg(project), "names": roster.names, "load": load,
                            "also": roster.names}
    verb = "loading" if load else "hashing"
    if fs:
        args["dir"] = layout.final
        say(f"verifying {len(roster.cells)} cells on the shared FS ({verb} each artifact)")
        with steps(log, None, "reconcile") as bar:  # one round trip: a spinner, then the count
            tree = sfs.probe("verify", args)
            bar.step(len(tree["dirs"]), len(tree["dirs"]), "result dirs verified on the shared FS")
    else:
        args["dir"] = str(Path(results_dir) if results_dir else default_results_dir(project))
        say(f"verifying {len(roster.cells)} cells in {args['dir']} ({verb} each artifact)")
        with steps(log, None, "reconcile") as bar:
            tree = verify.verify_tree(args, progress=bar.step)

    report = classify(project, roster, tree, hosts=list(project.hosts))
    report.source = "fs" if fs else "local"
    report.results_dir = str(tree["dir"])
    report.load = load
    report.results_exist = bool(tree["exists"])
    report.record = layout.reconcile_record
    record = _record(roster, report, tree)
    if report.complete:
        report.states = {"verified": report.verified}
    else:
        _classify_cells(project, sfs, report, record)
    # One line: with thousands of cells an indented record is mostly whitespace.
    sfs.write_atomic(layout.reconcile_record, (json.dumps(record) + "\n").encode())
    return report


def _classify_cells(project: Project, sfs: Any, report: ReconcileReport, record: dict[str, Any]) -> None:
    """Why each unverified cell is not: one FS snapshot and one tmux query per host (at once)."""
    try:
        got = collect(project, sfs, Verification.from_record(record))
    except (AblateError, OSError) as e:  # the reconcile itself stands; its exit code is unchanged
        report.classify_error = getattr(e, "message", None) or str(e)
        return
    report.states = got.counts()
    report.cell_states = {c.name: c for c in got.not_verified()}
    # A pulled copy that failed often lacks its MANIFEST.json (pull refuses a damaged FS copy):
    # key its verdict to the durable manifest it came from, so a re-made result is not `corrupt`.
    for name, entry in record["corrupt"].items():
        durable = got.state.snap.results.get(name)
        if entry.get("manifest_sha256") is None and durable is not None:
            entry["manifest_sha256"] = durable.sha256


def classify(project: Project, roster: Roster, tree: dict[str, Any], hosts: list[str]) -> ReconcileReport:
    cells_info: dict[str, Any] = tree["cells"]
    dirs: list[str] = tree["dirs"]
    report = ReconcileReport(roster=len(roster.cells), verified=0, complete=False)
    index = _Candidates(dirs, tree["entries"], roster, hosts)
    ckpt_hows: list[str] = []
    for name, cell in roster.cells.items():
        candidates = index.of(name)
        info = cells_info.get(name)
        if info is None:
            report.missing.append(name)
            continue
        ok = True
        for p in info["problems"] or []:
            ok = False
            if p["kind"] == "zero_byte":
                if name not in report.zero_byte:
                    report.zero_byte.append(name)
            else:
                report.corrupt.append({"name": name, "file": p["file"], "error": p["error"]})
        manifest = info.get("manifest")
        if isinstance(manifest, dict):
            for problem in _identity(project, cell, manifest):
                ok = False
                report.corrupt.append({"name": name, **problem})
        if len(candidates) > 1:
            ok = False
            report.duplicates.append(name)
            report.duplicate_dirs[name] = candidates
        if ok:
            report.verified += 1
            report.checked[name] = dict(info.get("checks") or {})
            ckpt_hows += checkpoint_checks(info.get("checks"), manifest).values()
    report.checkpoint_checks = check_counts(ckpt_hows)
    report.unexpected = [d for d in dirs if d not in roster.cells]
    # A case variant of a roster cell is not a roster cell: listed here and in that cell's duplicates.
    report.corrupt.sort(key=lambda c: (c["name"], c["file"]))
    report.complete = report.roster > 0 and report.verified == report.roster
    return report


class _Candidates:
    """Every dir that could be a cell's result: itself, case variants that are no other roster
    cell, and leftover staging dirs `.staging.<name>.<host>.<pid>`; indexed once (a listing of
    n dirs, n roster cells: linear, not n x n)."""

    def __init__(self, dirs: list[str], entries: list[str], roster: Roster, hosts: list[str]) -> None:
        self.dirs = set(dirs)
        self.folded: dict[str, list[str]] = {}
        for d in dirs:
            if d not in roster.cells:
                self.folded.setdefault(d.casefold(), []).append(d)
        self.staging: dict[str, list[str]] = {}
        for e in entries:
            owner = _staging_name(e, hosts)
            if owner is not None:
                self.staging.setdefault(owner, []).append(e)

    def of(self, name: str) -> list[str]:
        out = [name] if name in self.dirs else []
        out += [d for d in self.folded.get(name.casefold(), []) if d != name]
        return out + self.staging.get(name, [])


def _staging_name(entry: str, hosts: list[str]) -> str | None:
    prefix = ".staging."
    if not entry.startswith(prefix):
        return None
    rest, _, pid = entry[len(prefix):].rpartition(".")
    if not pid.isdigit() or not rest:
        return None
    # Names and hosts may both hold dots: peel off a known host; else take the last component.
    for host in sorted(hosts, key=len, reverse=True):
        if rest.endswith("." + host) and len(rest) > len(host) + 1:
            return rest[: -len(host) - 1]
    name, _, _host = rest.rpartition(".")
    return name or None


def _identity(project: Project, cell: Cell, manifest: dict[str, Any]) -> list[dict[str, str]]:
    """A result must come from this roster cell's (cfg, task, epochs) and its config as it is now."""
    recorded = (manifest.get("cfg"), manifest.get("task"), manifest.get("epochs"))
    if recorded != (cell.cfg, cell.task, cell.epochs):
        return [{"file": MANIFEST,
                 "error": f"MANIFEST.json records cfg={recorded[0]} task={recorded[1]} epochs={recorded[2]}, "
                          f"the roster has cfg={cell.cfg} task={cell.task} epochs={cell.epochs}: "
                          "a result of another config; remediate the cell"}]
    want = manifest.get("cfg_sha256")
    cfg_path = Path(cell.cfg) if cell.cfg.startswith("/") else project.dir / cell.cfg
    if isinstance(want, str) and cfg_path.is_file():
        have = hashlib.sha256(cfg_path.read_bytes()).hexdigest()
        if have != want:
            return [{"file": cell.cfg, "error": STALE}]
    return []


def _record(roster: Roster, report: ReconcileReport, tree: dict[str, Any]) -> dict[str, Any]:
    """The content of gate/reconcile.json (written by `reconcile` after classification)."""
    bad = {c["name"] for c in report.corrupt} | set(report.zero_byte) | set(report.duplicates)
    # What failed verification, keyed by the manifest it was checked against: classification calls
    # the durable copy `corrupt` while that manifest is still the one published.
    corrupt: dict[str, dict[str, Any]] = {}
    for name in report.zero_byte:
        corrupt[name] = {"error": "a zero-byte file"}
    for c in report.corrupt:
        corrupt.setdefault(c["name"], {"error": f"{c['file'] or '-'}: {c['error']}"})
    for name, entry in corrupt.items():
        entry["manifest_sha256"] = (tree["cells"].get(name) or {}).get("manifest_sha256")
    cells = {}
    for name in roster.cells:
        info = tree["cells"].get(name)
        if info is None or name in bad:
            continue
        cells[name] = {"manifest_sha256": info["manifest_sha256"], "files": info["files"]}
        if name in report.checked:  # status and the report say how it was verified (old records lack it)
            hows = check_counts(checkpoint_checks(report.checked[name], info.get("manifest")).values())
            cells[name].update(checked=report.checked[name], verified_by=next(reversed(hows), None))
    record = {
        "t": time.time(), "complete": report.complete, "roster": report.roster,
        "roster_digest": roster.digest(), "verified": report.verified, "load": report.load,
        "source": report.source, "results_dir": report.results_dir, "cells": cells,
        "corrupt": corrupt,
    }
    return record
