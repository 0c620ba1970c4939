"""Run the real CLI in-process (click's entry point, the one error boundary) from a test."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ablate.cli import main
from tests.conftest import LocalProject


def cli(capsys: pytest.CaptureFixture[str], p: LocalProject, *args: str) -> tuple[int, str]:
    """`ablate -C <project> ARGS`: its exit code and stdout + stderr."""
    with pytest.raises(SystemExit) as exc:
        main(["-C", str(p.root), *args])
    out, err = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else (0 if code is None else 1)), out + err


def js(capsys: pytest.CaptureFixture[str], p: LocalProject, *args: str, code: int = 0) -> dict[str, Any]:
    """`ablate -C <project> ARGS --json`: the one JSON object, after checking the exit code."""
    with pytest.raises(SystemExit) as exc:
        main(["-C", str(p.root), *args, "--json"])
    out, err = capsys.readouterr()
    assert (exc.value.code or 0) == code, (args, exc.value.code, out, err)
    data: dict[str, Any] = json.loads(out)
    return data
