"""The one error type that carries a user-facing message and the exit code of the contract.

Exit codes: 0 done / all holds; 1 the check the command exists for failed; 2 bad input or config.
"""

from __future__ import annotations


class AblateError(Exception):
    """Bad input or config: a one-line message naming the problem and the fix. Exit 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(AblateError):
    """ablate.yaml or a profile is invalid (message names the file, the key and why)."""


class QueueError(AblateError):
    """A queue file line is invalid, or a queue file was edited in its launched prefix."""


class CheckFailed(AblateError):
    """The check the command exists for failed (reconcile incomplete, release refused). Exit 1."""

    exit_code = 1


class RemoteError(AblateError):
    """A command on a host failed: names the host, the command, rc and both streams."""

    exit_code = 1


class Busy(AblateError):
    """Another controller holds the sweep's lock past --lock-timeout: who, since when. Exit 1."""

    exit_code = 1
