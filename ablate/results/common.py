"""What pull, reconcile and the report share about the results: where pulled copies land on the
controller, and the artifacts the `verify` probe is told to look for (ablate.yaml's `artifacts:`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.config.project import Project


def default_results_dir(project: Project) -> Path:
    return project.dir / "results" / project.sweep


def artifacts_arg(project: Project) -> dict[str, Any]:
    a = project.artifacts
    return {"checkpoint": list(a.checkpoint), "pick": a.pick, "metrics": a.metrics,
            "metrics_keys": list(a.metrics_keys)}
