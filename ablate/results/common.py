"""What pull, reconcile and the report share about the results: where pulled copies land on the
controller, the artifacts the `verify` probe is told to look for (ablate.yaml's `artifacts:`), and
which of verify's `checks` (how each file passed) are the checkpoint's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ablate.config.project import Project
from ablate.remote.checkpoints.artifacts import recorded


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
