"""The transport interface: how the controller reaches a host and the shared FS.

`local` (this machine, libtmux, a local directory as the shared FS) and `ssh` (Fabric/Paramiko)
implement the same two protocols, so commands never know which one they drive — errors included:
the same failure raises the same type on both. A failed command or tmux operation on a host is a
`RemoteError`; a failed operation on the shared FS is an `FSError` (a RemoteError, exit 1) naming the
host it went through ("local" for the local transport), the operation, the path and the reason (the
OS error, or the rc and stderr of the script on the host). Something that is not there is no
failure (`read_bytes` None, `listdir` [], `remove` / `rename_noreplace` False); only `fetch` raises
OSError, which its callers expect. `apply` runs a batch of small ops (the typed ops below) in order
in one round trip: the first that fails raises its FSError (as an `OpFailed`: which op, and the
results of those before it).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, cast

from ablate.errors import FSError, OpFailed, RemoteError


@dataclass(frozen=True)
class CommandResult:
    host: str
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    def check(self) -> CommandResult:
        if self.rc != 0:
            raise RemoteError(
                f"{self.host}: `{shlex.join(self.argv)}` exited {self.rc}; "
                f"stdout: {self.stdout.strip()[-300:]!r}; stderr: {self.stderr.strip()[-300:]!r}"
            )
        return self


class HostTransport(Protocol):
    """One instance: runs commands and drives its tmux server."""

    name: str

    def run(self, argv: Sequence[str], *, timeout: float = 60.0,
            stdin: bytes | None = None) -> CommandResult:
        """Run argv (each element one literal argument, never shell-interpreted)."""
        ...

    def stream(self, argv: Sequence[str], on_stdout: Callable[[bytes], None], *,
               stop: Callable[[], bool] | None = None, poll: float = 0.5) -> int | None:
        """Run argv, handing its stdout to `on_stdout` as it arrives (stderr is dropped), until it
        exits (its rc) or `stop()` (asked about every `poll` s) says so: then the command is ended
        and None returned. Ctrl-C ends the command too (and propagates)."""
        ...

    def tmux_start(self, session: str, argv: Sequence[str], env: Mapping[str, str],
                   cwd: str | None = None) -> None:
        """Start argv detached in a new tmux session; the queue survives the controller.
        RemoteError when tmux cannot start it."""
        ...

    def tmux_sessions(self) -> set[str]:
        """Names of the live tmux sessions on this host (empty when no server runs)."""
        ...

    def tmux_argv(self) -> list[str]:
        """The tmux command line (with its server's socket) that `tmux_sessions` asks, for a
        script that asks tmux in the same round trip as other things (`status`)."""
        ...

    def tmux_kill(self, session: str) -> None:
        ...

    def close(self) -> None:
        ...


class HeldLock(Protocol):
    """An exclusive flock(2) held on a file of the shared FS until `release()` (or this process's
    death: the lock never outlives its holder)."""

    def release(self) -> None:
        ...


@dataclass(frozen=True)
class CreateImmutable:
    """`SharedFS.create_immutable`; its result: True when created, False when already there."""

    path: str
    data: bytes


@dataclass(frozen=True)
class WriteAtomic:
    """`SharedFS.write_atomic`; its result: None."""

    path: str
    data: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class AppendLine:
    """`SharedFS.append_line`; its result: None."""

    path: str
    line: str


@dataclass(frozen=True)
class Remove:
    """`SharedFS.remove`; its result: True when the file was there."""

    path: str


@dataclass(frozen=True)
class Read:
    """`SharedFS.read_bytes`; its result: the bytes, or None when there is no such file."""

    path: str


FSOp: TypeAlias = CreateImmutable | WriteAtomic | AppendLine | Remove | Read
OpResult: TypeAlias = bool | bytes | None
# What an FSError of each op says it was doing (as its single operation's does).
VERBS: dict[type[Any], str] = {CreateImmutable: "creating", WriteAtomic: "writing",
                               AppendLine: "appending to", Remove: "removing", Read: "reading"}


class SharedFS(Protocol):
    """The sweep's shared filesystem, reached through one host that mounts it. Every operation but
    `fetch` raises `FSError` when it fails (see the module docstring)."""

    root: str

    def read_bytes(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist (or a directory on its path is a file)."""
        ...

    def write_atomic(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write to a temp file beside `path`, then rename over it."""
        ...

    def create_immutable(self, path: str, data: bytes) -> bool:
        """Create `path` with mode 0444 unless it exists. True if created; an existing file with
        other content is never written over (FSError)."""
        ...

    def append_line(self, path: str, line: str) -> None:
        ...

    def apply(self, ops: Sequence[FSOp]) -> list[OpResult]:
        """Run `ops` in order, in one round trip, each exactly as its single operation (the op
        types above say which, and what each gives back). The first op that fails raises the
        FSError its operation raises, as an `OpFailed` (`index`, and `done`: the results of the
        ops before it, which took effect); no op after it runs."""
        ...

    def exists(self, path: str) -> bool:
        ...

    def listdir(self, path: str) -> list[str]:
        """The names in directory `path`, sorted ([] when it does not exist or is no directory)."""
        ...

    def remove(self, path: str) -> bool:
        """Unlink the file `path` (read-only ones too); True if it existed. Never a directory."""
        ...

    def rename_noreplace(self, src: str, dst: str) -> bool:
        """Rename the file or directory `src` to `dst` (its parent created), never over an existing
        `dst`; True when renamed, False when `src` does not exist. FSError when `dst` exists or the
        rename fails. (Recording instead of deleting: a released claim, a result set aside.)"""
        ...

    def lock(self, path: str, timeout: float, record: tuple[str, bytes] | None = None) -> HeldLock | None:
        """Take an exclusive flock(2) on `path` (created when missing), waiting up to `timeout`
        seconds; None when it is still held elsewhere then. Not re-entrant: see `ablate.sweep.lock`.
        `record` (path, bytes): a file written atomically once the lock is held and removed just
        before it is let go, in the same round trips as the lock itself."""
        ...

    def probe(self, op: str, args: Mapping[str, Any]) -> Any:
        """Run one stdlib-only operation of `ablate.remote.host.probe` next to the files; one round trip.
        FSError when it fails there (an OSError in the probe, or no Python to run it)."""
        ...

    def fetch(self, path: str, local_path: str,
              on_bytes: Callable[[int], None] | None = None) -> int:
        """Stream the FS file `path` to `local_path` on the controller (created or truncated);
        returns the bytes written; `on_bytes(n)` is called as each chunk of n bytes lands. Raises
        OSError when `path` cannot be read. The caller checks size and sha256 and renames into
        place: a short copy must never look like a good one."""
        ...


def apply_each(fs: SharedFS, ops: Sequence[FSOp]) -> list[OpResult]:
    """`apply` as one call of the single operation per op (a transport with no round trips to save)."""
    done: list[OpResult] = []
    for i, op in enumerate(ops):
        try:
            if isinstance(op, CreateImmutable):
                done.append(fs.create_immutable(op.path, op.data))
            elif isinstance(op, WriteAtomic):
                fs.write_atomic(op.path, op.data, op.mode)
                done.append(None)
            elif isinstance(op, AppendLine):
                fs.append_line(op.path, op.line)
                done.append(None)
            elif isinstance(op, Remove):
                done.append(fs.remove(op.path))
            else:
                done.append(fs.read_bytes(op.path))
        except FSError as e:
            raise OpFailed(e, i, list(done)) from e
    return done


def apply_groups(fs: SharedFS, groups: Sequence[Sequence[FSOp]],
                 first: Sequence[FSOp] = ()) -> list[list[OpResult] | Exception]:
    """Groups of ops on disjoint files (one per queue, say), all in one `apply`: per group its
    results, or why it failed. A failing group never stops the others: the groups after it go in
    the next round trip (one more per failure). Of a failed group, the ops before the failing one
    took effect; when the batch failed as a whole (the host, the probe), every group left gets that
    error, and any op of it may or may not have run. `first`: ops that go before every group, in
    the same round trip, and that all must hold: the one that fails (or the batch, failing as a
    whole in that round trip) is raised, and no group ran after it."""
    out: list[list[OpResult] | Exception] = []
    lead = list(first)
    while len(out) < len(groups):
        rest = groups[len(out):]
        failed: Exception | None = None
        try:
            got = fs.apply([*lead, *(op for g in rest for op in g)])
        except OpFailed as e:
            if e.index < len(lead):
                raise
            got, failed = cast(list[OpResult], e.done), e
        except Exception as e:  # one failure is reported per group, never raised past the others
            if lead:
                raise
            out += [e] * len(rest)
            break
        got, lead = got[len(lead):], []
        at = 0
        for g in rest:
            if at + len(g) > len(got):
                break
            out.append(got[at:at + len(g)])
            at += len(g)
        if failed is not None:
            out.append(failed)
    if lead:  # no group at all
        fs.apply(lead)
    return out
