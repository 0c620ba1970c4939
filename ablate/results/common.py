"""What pull, reconcile and the report share about the results: where pulled copies land on the
controller, the artifacts the `verify` probe is told to look for (ablate.yaml's `artifacts:`), and
how a result's files were checked (verify's `checks`: loaded / structure / hash / size)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ablate.config.project import Project
from ablate.remote.artifacts import recorded

# verify's ways a file passed, strongest first: read by its library; parsed and checked without
# running its code; size and sha256 against MANIFEST.json; size alone.
CHECKS = ("loaded", "structure", "hash", "size")


def default_results_dir(project: Project) -> Path:
    return project.dir / "results" / project.sweep


def artifacts_arg(project: Project) -> dict[str, Any]:
    a = project.artifacts
    out: dict[str, Any] = {"checkpoint": list(a.checkpoint), "pick": a.pick, "metrics": a.metrics,
                           "metrics_keys": list(a.metrics_keys)}
    if a.verify:  # absent unless ablate.yaml sets it: the probe's argument is as before
        out["verify"] = dict(a.verify)
    return out


def checkpoint_checks(checks: Mapping[str, str] | None, manifest: Any) -> dict[str, str]:
    """The checkpoint files' part of verify's {file: how}: what MANIFEST.json records as checkpoint
    (the metrics and the log are checked by their own rules, the same in every sweep)."""
    files = {e.get("file") for e in recorded(manifest if isinstance(manifest, dict) else None, "checkpoint")
             if isinstance(e, dict)}
    return {f: how for f, how in (checks or {}).items() if f in files}


def weakest(hows: Iterable[str]) -> str | None:
    """The weakest check among `hows` (None for none); an unknown word ranks below `size`."""
    rank = {h: i for i, h in enumerate(CHECKS)}
    return max(hows, key=lambda h: rank.get(h, len(CHECKS)), default=None)


def check_counts(hows: Iterable[str]) -> dict[str, int]:
    """{how: files}, strongest first (only the ways that occur)."""
    counts: dict[str, int] = {}
    for h in hows:
        counts[h] = counts.get(h, 0) + 1
    order = {h: i for i, h in enumerate(CHECKS)}
    return dict(sorted(counts.items(), key=lambda kv: order.get(kv[0], len(CHECKS))))


def counts_text(counts: Mapping[str, int], noun: str = "files") -> str:
    """`loaded 12 files, structure 8, hash 1` (the noun once, after the first count)."""
    return ", ".join(f"{h} {n}" + (f" {noun}" if i == 0 else "") for i, (h, n) in enumerate(counts.items()))
