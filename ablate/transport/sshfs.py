"""The shared FS over SSH (`SharedFS`): every operation is one small bash script run through a host
that mounts the FS, the next host used only when one cannot be reached; the many-file reads and
`apply`'s batches of writes are one run of the shipped probe (`ablate.remote`), content-addressed
under `<root>/lib/<sha12>/` (itself shipped in one round trip)."""

from __future__ import annotations

import base64
import contextlib
import errno
import functools
import hashlib
import json
import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO, TypeVar

from ablate.errors import FSError, OpFailed, RemoteError
from ablate.remote.host.fs_writes import CONFLICT
from ablate.remote.host.probe import ENTRY as PROBE_ENTRY
from ablate.remote.layout import SweepLayout
from ablate.transport.base import VERBS, AppendLine, CreateImmutable, FSOp, OpResult, Read, WriteAtomic
from ablate.transport.shellhost import BASH_C, HostUnreachable, Live, ShellHost, Sink

# The probe's library (`probe_lib`): exactly the modules `ablate.remote.host.probe` imports at any
# depth (tests/test_shipped_code.py), stdlib only.
PROBE_MODULES = ("ablate.remote.checkpoints.artifacts", "ablate.remote.checkpoints.filecheck",
                 "ablate.remote.checkpoints.framework_dirs", "ablate.remote.checkpoints.loaders",
                 "ablate.remote.checkpoints.pickles", "ablate.remote.checkpoints.torchzip",
                 "ablate.remote.checkpoints.verify", "ablate.remote.host.fs_writes",
                 "ablate.remote.host.probe", "ablate.remote.layout")
T = TypeVar("T")


class _Counted:
    """A binary file that reports each chunk written (pull's progress bar)."""

    def __init__(self, f: BinaryIO, on_bytes: Callable[[int], None]) -> None:
        self.f, self.on_bytes = f, on_bytes

    def write(self, data: bytes, /) -> int:
        n = self.f.write(data)
        self.on_bytes(len(data))
        return n


_READ = '[ -e "$1" ] || exit 3; exec cat -- "$1"'
_TEMP = 'd=$(dirname -- "$1"); mkdir -p -- "$d"; t=$(mktemp "$d/.$(basename -- "$1").tmp.XXXXXXXX"); ' \
        "trap 'rm -f -- \"$t\"' EXIT; cat > \"$t\"; sync -- \"$t\" 2>/dev/null || true; "
_WRITE = "set -e; " + _TEMP + 'chmod "$2" "$t"; mv -f -- "$t" "$1"'
# link() fails when the name exists, so two deployers racing can never overwrite each other.
_IMMUTABLE = ('same() { [ "$(sha256sum < "$1" | cut -d" " -f1)" = "$2" ]; }\n'
              'if [ -e "$1" ]; then if same "$1" "$2"; then echo same; exit 0; fi; exit 4; fi\n'
              "set -e; " + _TEMP + 'same "$t" "$2" || exit 5; chmod 444 "$t"\n'
              'if ln -- "$t" "$1" 2>/dev/null; then echo created; exit 0; fi\n'
              'if same "$1" "$2"; then echo same; exit 0; fi; exit 4')
_APPEND = 'mkdir -p -- "$(dirname -- "$1")" && printf "%s\\n" "$2" >> "$1"'
_LISTDIR = '[ -d "$1" ] || exit 0; exec find "$1" -mindepth 1 -maxdepth 1 -printf "%f\\0"'
_REMOVE = ('[ -d "$1" ] && { echo "Is a directory" >&2; exit 4; }; [ -e "$1" ] || [ -L "$1" ] || exit 3; '
           'rm -f -- "$1"')
# mv -T -n: never into or over an existing dst (renameat2 NOREPLACE where the FS has it); src
# still there afterwards means it did not happen.
_RENAME = ('there() { [ -e "$1" ] || [ -L "$1" ]; }; there "$1" || exit 3; there "$2" && exit 4\n'
           'mkdir -p -- "$(dirname -- "$2")" || exit 5\n'
           'err=$(mv -T -n -- "$1" "$2" 2>&1)\n'
           'if there "$1"; then there "$2" && exit 4; printf "%s\\n" "$err" >&2; exit 6; fi')
# The lock is held by flock(1) for as long as `cat` reads the channel: the controller's exit, death
# or lost connection closes it, cat sees EOF, the holder record ($3, content $4) is removed while
# the lock is still held, and the lock is free. -E 75: still busy when -w ran out.
_FLOCKED = ('r=$1; if [ -n "$r" ]; then t="$r.tmp.$$"; printf "%s\\n" "$2" > "$t" && mv -f -- "$t" "$r" '
            '|| exit 94; fi\necho ACQUIRED; cat >/dev/null; [ -z "$r" ] || rm -f -- "$r"')
_FLOCK = ('mkdir -p -- "$(dirname -- "$1")" || exit 96; command -v flock >/dev/null || exit 95\n'
          'exec flock -E 75 -w "$2" "$1" bash --norc -c "$5" bash "$3" "$4"')
# $4: `-S` (no site-packages: a third of a Python start) for every op but `verify`, which loads
# checkpoints with the libraries installed there.
# The probe's bytecode is cached on the host, in the user's own cache dir (never a shared /tmp
# dir another user could fill first), keyed by the library's content-addressed path: ~40 ms less per
# probe start. Without HOME, nothing is written.
PYC = ('c=${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}; '
       'if [ -n "$c" ]; then export PYTHONPYCACHEPREFIX="$c/ablate/pyc"; '
       'else export PYTHONDONTWRITEBYTECODE=1; fi\n')
# `python -c ENTRY OP ARGS` in the library dir: the probe's `main`.
PROBE_RUN = f'PYTHONPATH="$d" exec "$py" ${{f:+"$f"}} -c {shlex.quote(PROBE_ENTRY)} "$@"'
_PROBE = ('d=$1; e=$2; py=$3; f=$4; shift 4; [ -r "$d/ablate/remote/host/probe.py" ] || exit 97\n'
          'if [ -n "$e" ]; then eval "$e" >&2 || exit 98; fi\n'
          + PYC + 'cd "$d" && ' + PROBE_RUN)
_NEEDS_SITE = frozenset({"verify"})

# The probe's library in one round trip, without Python (the probe is what says it is missing): a
# script on stdin runs _IMMUTABLE ($1) for each file, its bytes from a base64 here-document; the
# first that fails names its path on stderr's last line and exits with _IMMUTABLE's code.
_SHIP = 'imm=$1; eval "$(cat)"'
# The same through fs_writes' source in one Python (`SSHFS._ship_py`), where the host's agent runs.
_FSOPS_RUN = ('e=$1; py=$2; src=$3; if [ -n "$e" ]; then eval "$e" >&2 || exit 98; fi\n'
              'exec "$py" -S -c "$src"')
_SHIP_ONE = ("base64 -d <<'ABLATE_EOF' | bash --norc -c \"$imm\" bash {path} {sha} >/dev/null || "
             "{{ r=$?; printf '%s\\n' {path} >&2; exit $r; }}\n{data}ABLATE_EOF\n")


def probe_command(lib_dir: str, env: str, python: str, op: str,
                  arg: str) -> tuple[str, dict[str, Any] | None]:
    """The shell command line that runs probe `op` with `arg` from `lib_dir` (rc 97: the library
    is not there; 98: the profile's env failed), and, for an op that needs no site-packages, its
    `py` form, which a host agent started with that `python` runs in its own interpreter
    (`ablate.remote.host.agent`): the op is stdlib only, so the profile's env, which only picks the
    interpreter, changes nothing of it (`doctor` checks the env)."""
    site = op in _NEEDS_SITE
    command = shlex.join([*BASH_C, _PROBE, "bash", lib_dir, env, python, "" if site else "-S", op, arg])
    py = None if site else {"dir": lib_dir, "entry": PROBE_ENTRY, "argv": [op, arg], "python": python,
                            "needs": "ablate/remote/host/probe.py", "min": [3, 8]}
    return command, py


def probe_lib() -> dict[str, bytes]:
    """The files a host runs for `probe`: exactly the stdlib-only modules `ablate.remote.host.probe`
    imports at any depth (its ops, the path layout, the checkpoints' verification), under their
    package paths (tests/test_shipped_code.py). Read once per process (a status makes two SSHFS)."""
    return dict(_probe_lib())


@functools.lru_cache(maxsize=1)
def _probe_lib() -> tuple[tuple[str, bytes], ...]:
    from ablate import resources as packaged

    return tuple(packaged.module_files(PROBE_MODULES).items())


@functools.lru_cache(maxsize=1)
def lib_digest() -> str:
    """The probe library's content address (`lib/<sha12>/` on the FS)."""
    digest = hashlib.sha256()
    lib = probe_lib()
    for rel in sorted(lib):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(lib[rel]).digest())
    return digest.hexdigest()[:12]


class RemoteFlock:
    """A flock(2) on a shared-FS file held by `flock … cat` on a host for as long as `live` runs."""

    def __init__(self, live: Live, host: str, path: str) -> None:
        self.live, self.host, self.path = live, host, path

    @classmethod
    def wait(cls, live: Live, host: str, path: str, deadline_s: float) -> RemoteFlock | None:
        """Read the command until flock says ACQUIRED (held) or exits (75: busy -> None)."""
        out, err = b"", b""
        deadline = time.monotonic() + deadline_s
        while True:
            o, e = live.read(min(0.1, max(0.0, deadline - time.monotonic())))
            out, err = out + o, err + e
            if b"ACQUIRED\n" in out:
                return cls(live, host, path)
            rc = live.exit_status()
            if rc is not None:
                live.close()
                if rc == 75:
                    return None
                why = {94: "cannot write the holder record",
                       95: "`flock` (util-linux) is not installed there",
                       96: "cannot create the lock's directory"}.get(rc)
                stderr = repr(err.decode(errors="replace").strip()[-300:])
                if why is None:
                    raise FSError(host, "locking", path, stderr, rc=rc)
                raise FSError(host, "locking", path, f"{why}: {stderr}")
            if time.monotonic() >= deadline:
                live.close()
                raise RemoteError(f"{host}: no answer while locking {path} within {deadline_s:g}s")

    def release(self) -> None:
        """EOF to `cat`: it exits, flock exits, the lock is free (waited for, briefly)."""
        with contextlib.suppress(OSError, RemoteError):
            self.live.shutdown_write()
            deadline = time.monotonic() + 10.0
            while self.live.exit_status() is None and time.monotonic() < deadline:
                self.live.read(0.1)
        self.live.close()


class SSHFS:
    """The shared FS through a host that mounts it (SharedFS). With several hosts, a host that
    cannot be reached is skipped for the next one; nothing is ever retried after it started."""

    def __init__(self, hosts: ShellHost | Sequence[ShellHost], root: str, *, python: str = "python3",
                 env: str | None = None, timeout: float = 120.0, probe_timeout: float = 900.0) -> None:
        self.hosts = [hosts] if isinstance(hosts, ShellHost) else list(hosts)
        if not self.hosts:
            raise ValueError("SSHFS needs at least one host")
        self.root = root.rstrip("/") or "/"
        self.python = python
        self.env = env or ""
        self.timeout = timeout
        self.probe_timeout = probe_timeout
        self.via = self.hosts[0].name  # the host the last operation went through
        self._lib_ready = False
        self.lib_dir = SweepLayout(self.root).lib_dir(lib_digest())
        self._lib = probe_lib()

    def _sh(self, script: str, *args: str, stdin: bytes | None = None, timeout: float | None = None,
            sink: Sink | None = None) -> tuple[int, bytes, bytes]:
        # bash, not sh: a profile's `env` (`source …/activate`) is bash; dash has no `source`.
        return self._exec(shlex.join([*BASH_C, script, "bash", *args]), stdin=stdin, timeout=timeout,
                          sink=sink)

    def _exec(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None,
              sink: Sink | None = None, py: Mapping[str, Any] | None = None) -> tuple[int, bytes, bytes]:
        return self._first(lambda host: host.exec(command, timeout=timeout or self.timeout, stdin=stdin,
                                                  sink=sink, py=py))

    def _first(self, fn: Callable[[ShellHost], T]) -> T:
        """`fn` through the first host that answers (`via` names it); a host that cannot be reached
        is skipped for the next, nothing is retried once it started."""
        last: HostUnreachable | None = None
        for host in self.hosts:
            try:
                got = fn(host)
            except HostUnreachable as e:
                last = e
                continue
            self.via = host.name
            return got
        assert last is not None
        if len(self.hosts) == 1:
            raise last
        raise HostUnreachable(f"shared FS {self.root}: no host that mounts it answers "
                              f"({', '.join(h.name for h in self.hosts)}); last: {last.message}")

    def _fail(self, what: str, path: str, rc: int, err: bytes, dst: str | None = None) -> FSError:
        return FSError(self.via, what, path, repr(err.decode(errors="replace").strip()[-300:]), rc=rc,
                       dst=dst)

    def read_bytes(self, path: str) -> bytes | None:
        rc, out, err = self._sh(_READ, path)
        if rc == 3:
            return None
        if rc != 0:
            raise self._fail("reading", path, rc, err)
        return out

    def write_atomic(self, path: str, data: bytes, mode: int = 0o644) -> None:
        rc, _, err = self._sh(_WRITE, path, format(mode, "o"), stdin=data)
        if rc != 0:
            raise self._fail("writing", path, rc, err)

    def create_immutable(self, path: str, data: bytes) -> bool:
        rc, out, err = self._sh(_IMMUTABLE, path, hashlib.sha256(data).hexdigest(), stdin=data)
        if rc == 4:
            raise FSError(self.via, "creating", path,
                          "it exists with other content; an immutable file is never overwritten")
        if rc != 0:
            raise self._fail("creating", path, rc, err)
        return out.strip() == b"created"

    def append_line(self, path: str, line: str) -> None:
        rc, _, err = self._sh(_APPEND, path, line.rstrip("\n"))
        if rc != 0:
            raise self._fail("appending to", path, rc, err)

    def exists(self, path: str) -> bool:
        rc, _, _ = self._sh('[ -e "$1" ]', path)
        return rc == 0

    def listdir(self, path: str) -> list[str]:
        rc, out, err = self._sh(_LISTDIR, path)
        if rc != 0:
            raise self._fail("listing", path, rc, err)
        return sorted(n for n in out.decode(errors="replace").split("\0") if n)

    def remove(self, path: str) -> bool:
        rc, _, err = self._sh(_REMOVE, path)
        if rc == 3:
            return False
        if rc != 0:
            raise self._fail("removing", path, rc, err)
        return True

    def rename_noreplace(self, src: str, dst: str) -> bool:
        rc, _, err = self._sh(_RENAME, src, dst)
        if rc == 3:
            return False
        if rc == 4:
            raise FSError(self.via, "renaming", src, "the destination exists; a rename never replaces it",
                          dst=dst)
        if rc != 0:
            raise self._fail("renaming", src, rc, err, dst=dst)
        return True

    def lock(self, path: str, timeout: float, record: tuple[str, bytes] | None = None) -> RemoteFlock | None:
        """flock(2) on `path` through the first host that answers, held by a long-lived channel.
        `record` is one line of text (its bytes without the newline)."""
        rec_path, rec = (record[0], record[1].decode().rstrip("\n")) if record else ("", "")
        script = shlex.join([*BASH_C, _FLOCK, "bash", path, format(max(0.0, timeout), "g"),
                             rec_path, rec, _FLOCKED])
        live = self._first(lambda host: host.open_live(script, timeout=self.timeout))
        return RemoteFlock.wait(live, self.via, path, timeout + self.timeout)

    def fetch(self, path: str, local_path: str,
              on_bytes: Callable[[int], None] | None = None) -> int:
        """Stream `path` to `local_path` (created or truncated); the bytes written. The caller
        checks size and sha256 before publishing the copy."""
        with open(local_path, "wb") as f:
            rc, _, err = self._sh(_READ, path, sink=_Counted(f, on_bytes) if on_bytes else f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        if rc == 3:
            raise FileNotFoundError(errno.ENOENT, f"{self.via}: no such file on the shared FS", path)
        if rc != 0:
            raise OSError(errno.EIO, f"{self.via}: reading failed (rc {rc}): "
                                     f"{err.decode(errors='replace').strip()[-300:]}", path)
        return size

    def apply(self, ops: Sequence[FSOp]) -> list[OpResult]:
        """One run of the probe's `apply` (the ops as JSON on stdin: wrappers are tens of KB)."""
        if not ops:
            return []
        payload = json.dumps({"root": self.root, "ops": [_wire(op) for op in ops]}).encode()
        return self._answer(ops, self._run_probe("apply", "-", payload, self.timeout))

    def ship_probe(self) -> None:
        """Place the probe's files content-addressed under <root>/lib/<sha12>/ (0444, never
        overwritten), in one round trip, probe.py last: there, it says the rest is. A changed
        ablate is a new directory; a running probe keeps its files. Where the host's agent runs,
        fs_writes places them in one forked Python (`_ship_py`); else a shell script does, with no
        Python at all (`_SHIP`: the probe is what reports a missing one)."""
        files = sorted(self._lib.items(), key=lambda kv: (kv[0].endswith("/probe.py"), kv[0]))
        ops = [CreateImmutable(f"{self.lib_dir}/{rel}", data) for rel, data in files]

        def ship(host: ShellHost) -> tuple[bool, int, bytes, bytes]:
            if host.agent_runs(self.python):
                return (True, *self._ship_py(host, ops))
            script = "".join(_SHIP_ONE.format(path=shlex.quote(op.path),
                                              sha=hashlib.sha256(op.data).hexdigest(),
                                              data=base64.encodebytes(op.data).decode()) for op in ops)
            return (False, *host.exec(shlex.join([*BASH_C, _SHIP, "bash", _IMMUTABLE]),
                                      timeout=self.timeout, stdin=script.encode()))

        as_py, rc, out, err = self._first(ship)
        lines = err.decode(errors="replace").strip().splitlines() or [self.lib_dir]
        if as_py and rc == 0:
            try:
                answer = json.loads(out)
            except ValueError:
                raise RemoteError(f"{self.via}: placing the probe library under {self.lib_dir} did not "
                                  f"print fs_writes' answer; stdout: {out.decode(errors='replace')[:300]!r}; "
                                  f"stderr: {lines[-1][-300:]!r}") from None
            self._answer(ops, answer)
        elif as_py and rc == 98:
            raise RemoteError(f"{self.via}: the profile's env `{self.env}` failed before placing the "
                              f"probe library: {lines[-1][-300:]!r}")
        elif rc == 4 and not as_py:
            raise FSError(self.via, "creating", lines[-1], CONFLICT)
        elif rc != 0:
            raise self._fail("creating", self.lib_dir if as_py else lines[-1], rc,
                             "\n".join(lines if as_py else lines[:-1]).encode())
        self._lib_ready = True

    def _ship_py(self, host: ShellHost, ops: Sequence[CreateImmutable]) -> tuple[int, bytes, bytes]:
        """`ops` through fs_writes' own source (`python -S -c`, the ops as JSON on stdin), which the
        host's agent runs in a forked child: one process where the script runs ~10 per file."""
        source = self._lib["ablate/remote/host/fs_writes.py"].decode()
        command = shlex.join([*BASH_C, _FSOPS_RUN, "bash", self.env, self.python, source])
        py = {"dir": "/", "entry": source, "argv": [], "python": self.python, "needs": ".", "min": [3, 8]}
        payload = json.dumps({"ops": [_wire(op) for op in ops]}).encode()
        return host.exec(command, timeout=self.timeout, stdin=payload, py=py)

    def probe(self, op: str, args: Mapping[str, Any]) -> Any:
        return self._run_probe(op, json.dumps(dict(args)), None, self.probe_timeout, args.get("root"))

    def _run_probe(self, op: str, arg: str, stdin: bytes | None, timeout: float, root: Any = None) -> Any:
        """`python -m ablate.remote.host.probe OP ARG` (ARG `-`: the JSON on stdin), the library shipped
        first when it is not there yet."""
        for _ in range(2):
            command, py = probe_command(self.lib_dir, self.env, self.python, op, arg)
            rc, out, err = self._exec(command, stdin=stdin, timeout=timeout, py=py)
            if rc == 97 and not self._lib_ready:
                self.ship_probe()
                continue
            break
        command = shlex.join([self.python, "-m", "ablate.remote.host.probe", op, arg[:200]])
        stderr = err.decode(errors="replace").strip()[-300:]
        if rc == 98:
            raise RemoteError(f"{self.via}: the profile's env `{self.env}` failed before "
                              f"`{command}`: {stderr!r}")
        if rc != 0:  # the probe failed next to the files (an OSError there, or no python)
            text = err.decode(errors="replace").strip()
            if "Traceback (most recent call last):" in text:  # its last line names the failure
                stderr = text.splitlines()[-1][-300:]
            raise FSError(self.via, f"probe {op} of", root if isinstance(root, str) else self.root,
                          f"`{command}`; stderr: {stderr!r}", rc=rc)
        try:
            return json.loads(out)
        except ValueError:
            raise RemoteError(
                f"{self.via}: `{command}` did not print exactly one JSON document (does the "
                f"profile's env print to stdout?); stdout: {out.decode(errors='replace')[:300]!r}; "
                f"stderr: {stderr!r}") from None

    def _answer(self, ops: Sequence[FSOp], answer: Any) -> list[OpResult]:
        """fs_writes' answer as `apply` returns it: the results, or the first failure raised."""
        try:
            done = [_result(op, r) for op, r in zip(ops, answer["results"], strict=False)]
            failed = answer["failed"]
            if failed is None and len(done) == len(ops):
                return done
            i, why = int(failed["index"]), str(failed["reason"])
            op = ops[i]
        except (KeyError, TypeError, ValueError, IndexError):
            raise RemoteError(f"{self.via}: {len(ops)} op(s) on the shared FS got an answer that is not "
                              f"fs_writes': {str(answer)[:300]!r}; is the probe under {self.lib_dir} damaged?"
                              ) from None
        raise OpFailed(FSError(self.via, VERBS[type(op)], op.path, why), i, list(done))


def _wire(op: FSOp) -> dict[str, Any]:
    """One op as `ablate.remote.host.fs_writes` reads it (bytes as base64)."""
    if isinstance(op, CreateImmutable):
        return {"op": "create_immutable", "path": op.path, "data": base64.b64encode(op.data).decode(),
                "sha256": hashlib.sha256(op.data).hexdigest()}
    if isinstance(op, WriteAtomic):
        return {"op": "write_atomic", "path": op.path, "data": base64.b64encode(op.data).decode(),
                "mode": op.mode}
    if isinstance(op, AppendLine):
        return {"op": "append_line", "path": op.path, "line": op.line}
    return {"op": "read" if isinstance(op, Read) else "remove", "path": op.path}


def _result(op: FSOp, got: Any) -> OpResult:
    if isinstance(op, Read):
        return None if got is None else base64.b64decode(got)
    if isinstance(op, WriteAtomic | AppendLine):
        return None
    return bool(got)  # created, removed
