"""Running the CLI from a test, the two ways a user's shell would.

In this process: `Cli` (the `cli` fixture) calls `ablate.cli.main`, click's entry point and the
one error boundary, and returns what the shell would see: the exit code, stdout and stderr.
As a separate process: `ablate_process` (`python -m ablate`, importing this checkout or an
upgraded copy) for a second controller, a process a test signals or kills, or one that must not
share this process's state; `ablate_cmd` is that command for a shell in a tmux pane.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import ablate
from ablate.cli import main
from tests.helpers.project import LocalProject

REPO = Path(ablate.__file__).resolve().parent.parent  # what `python -m ablate` imports

# Where a command runs: `-C <dir>` (a LocalProject's root), or None for no -C.
ProjectDir = LocalProject | Path | str | None


def exit_code(code: object) -> int:
    """The process's exit status after `sys.exit(code)`: None is 0, an int is itself, anything
    else (a message) is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


class CliResult(NamedTuple):
    code: int
    out: str
    err: str

    @property
    def output(self) -> str:
        """stdout then stderr: for a message that may be on either."""
        return self.out + self.err

    def json(self) -> dict[str, Any]:
        """The one JSON object on stdout (`--json`)."""
        data = json.loads(self.out)
        assert isinstance(data, dict), self.out
        return data


def _dir_args(project: ProjectDir) -> list[str]:
    if project is None:
        return []
    return ["-C", str(project.root if isinstance(project, LocalProject) else project)]


class Cli:
    """`ablate [-C DIR] ARGS` in this process: the `cli` fixture."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    def __call__(self, project: ProjectDir, *args: str) -> CliResult:
        argv = [*_dir_args(project), *args]
        self._capsys.readouterr()  # the result holds this command's output only
        try:
            main(argv)
        except SystemExit as e:
            code = e.code
        else:
            raise AssertionError(f"`ablate {shlex.join(argv)}`: main() returned instead of exiting")
        out, err = self._capsys.readouterr()
        if code is not None and not isinstance(code, int):
            err += f"{code}\n"  # as sys.exit prints it
        return CliResult(exit_code(code), out, err)

    def json(self, project: ProjectDir, *args: str, code: int = 0) -> dict[str, Any]:
        """`ablate [-C DIR] ARGS --json`: the one JSON object on stdout, once the exit code is
        checked to be `code`."""
        r = self(project, *args, "--json")
        assert r.code == code, (args, r.code, r.out, r.err)
        return r.json()


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ablate_process(project: ProjectDir, *args: str, pythonpath: Path = REPO,
                   cwd: Path | None = None) -> subprocess.Popen[str]:
    """`python -m ablate [-C DIR] ARGS` as its own process, importing ablate from `pythonpath`:
    stdin /dev/null, stdout and stderr piped (text).

    SIGINT is at its default in it, as in a command a shell runs in the foreground. Otherwise a
    test run started with SIGINT ignored (a background job of a non-interactive shell, some CI
    runners) passes SIG_IGN on through exec, Python then installs no KeyboardInterrupt handler,
    and a SIGINT the test sends is silently dropped."""
    return subprocess.Popen([sys.executable, "-m", "ablate", *_dir_args(project), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(pythonpath)},
                            preexec_fn=_sigint_default)


def ablate_cmd() -> str:
    """How a shell (a tmux pane, `bash -c`) runs this checkout's ablate; the console script may not
    be installed."""
    return f"PYTHONPATH={shlex.quote(str(REPO))} {shlex.quote(sys.executable)} -m ablate"
