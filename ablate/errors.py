"""The errors that carry a user-facing message, and the exit codes of the contract — all in one place.

Exit codes (the `main` boundary in `ablate.cli` is the only place that turns errors into them):

- 0 `EXIT_OK`: done / all holds.
- 1 `EXIT_CHECK_FAILED`: the check the command exists for failed (`CheckFailed`: reconcile
  incomplete, release refused, doctor found a problem), or a host or the shared FS failed
  (`RemoteError`, `FSError`, `Busy`).
- 2 `EXIT_BAD_INPUT`: bad input or config (`AblateError`, `ConfigError`, `QueueError`, click usage
  errors) — a message naming what is wrong; nothing changed.
- 3 `EXIT_INTERNAL`: an unexpected internal error (any other exception: a bug, or a failure nothing
  anticipated). One line on stderr names the exception type and message and the log file holding
  the full traceback (`$XDG_STATE_HOME/ablate/`, else `~/.local/state/ablate/`, else the temp dir).
- 130 `EXIT_INTERRUPTED`: Ctrl-C (`KeyboardInterrupt`, `click.Abort`); a `SystemExit` a command raises
  itself (`status --watch` leaving on Ctrl-C) passes through unchanged.

Every error is one line on stderr (`ablate: error: ...`) and, under `--json`, `{"error": ...}` on
stdout unless the command already printed its one JSON object there.

Transports raise the same type for the same failure: a failed operation on the shared FS is an
`FSError` whichever transport reached it (`local` turns its OSErrors into one; `ssh` raises one for a
script that failed on the host), so callers catch one type and users read comparable messages.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


class AblateError(Exception):
    """Bad input or config: a one-line message naming the problem and the fix. Exit 2."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(AblateError):
    """ablate.yaml or a profile is invalid (message names the file, the key and why)."""


class QueueError(AblateError):
    """A queue file line is invalid, or a queue file was edited in its launched prefix."""


class CheckFailed(AblateError):
    """The check the command exists for failed (reconcile incomplete, release refused). Exit 1."""

    exit_code = EXIT_CHECK_FAILED


class RemoteError(AblateError):
    """A command on a host failed: names the host, the command, rc and both streams. Exit 1."""

    exit_code = EXIT_CHECK_FAILED


class FSError(RemoteError):
    """An operation on the shared FS failed. Exit 1 (a RemoteError, whichever transport).

    Names the host it went through (`via`; "local" for the local transport), the operation (`op`,
    e.g. "writing"), the path (and `dst` for a rename) and the reason: the OS error locally, the
    script's rc and stderr over SSH. `local: writing /p/x failed: [Errno 13] Permission denied` and
    `tb-h1: writing /p/x failed (rc 1): '...Permission denied'` are the same failure."""

    def __init__(self, via: str, op: str, path: str, reason: str, *, rc: int | None = None,
                 dst: str | None = None) -> None:
        target = path if dst is None else f"{path} to {dst}"
        status = "" if rc is None else f" (rc {rc})"
        super().__init__(f"{via}: {op} {target} failed{status}: {reason}")
        self.via, self.op, self.path, self.dst, self.reason, self.rc = via, op, path, dst, reason, rc


class OpFailed(FSError):
    """The op at `index` of a `SharedFS.apply` batch failed: the FSError its single operation
    raises, plus the results of the ops before it (`done`), which all took effect; none after it
    ran."""

    def __init__(self, error: FSError, index: int, done: list[object]) -> None:
        super().__init__(error.via, error.op, error.path, error.reason, rc=error.rc, dst=error.dst)
        self.index, self.done = index, done


class Busy(AblateError):
    """Another controller holds the sweep's lock past --lock-timeout: who, since when. Exit 1."""

    exit_code = EXIT_CHECK_FAILED
