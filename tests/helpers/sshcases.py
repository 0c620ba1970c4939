"""ssh configs and known_hosts files as users write them, and OpenSSH itself as the oracle.

    oracle        `ssh -F cfg -o BatchMode=yes alias true`: what OpenSSH makes of a config
    host_block    one `Host` block reaching a test bed instance
    host_key      an instance's current host key (`kind base64`); public_key/new_key: any key's
    known_names   the known_hosts lines `ssh-keygen -F` finds for a name (hashed ones too)
    keygen_hint   the `ssh-keygen -f FILE -R NAME` command an error message tells the user to paste
    passwd_home   where OpenSSH's `~/.ssh/config` and `~/.ssh/known_hosts` are (not $HOME)
    ssh_dir_file  a file under some home's .ssh/, removed after (and .ssh/ too when made for it)
    ssh_agent     a real `ssh-agent -D` on a socket of its own, killed after
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.helpers.wait import wait_for
from tests.testbed import Testbed


def oracle(cfg: Path | None, alias: str, *options: str, command: str = "true",
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """OpenSSH's verdict: `ssh [-F cfg] -o BatchMode=yes [-o OPTION...] alias command`."""
    argv = ["ssh", *(["-F", str(cfg)] if cfg is not None else []), "-o", "BatchMode=yes",
            *[a for o in options for a in ("-o", o)], alias, command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env=env)


def host_block(alias: str, hostname: str, *, key: Path | str, known: Path | str | None = None,
               strict: str | None = "yes", lines: Sequence[str] = ()) -> str:
    """A `Host alias` block: root@hostname with one identity; `lines` go first (first value wins)."""
    body = [*lines, f"HostName {hostname}", "User root", f"IdentityFile {key}", "IdentitiesOnly yes"]
    if known is not None:
        body.append(f"UserKnownHostsFile {known}")
    if strict is not None:
        body.append(f"StrictHostKeyChecking {strict}")
    return f"\nHost {alias}\n" + "".join(f"  {line}\n" for line in body)


def public_key(path: Path) -> str:
    """`kind base64` of a public key file (as a known_hosts line or authorized_keys wants it)."""
    kind, blob = path.read_text().split()[:2]
    return f"{kind} {blob}"


def host_key(tb: Testbed, host: str) -> str:
    """`kind base64` of the host key `host` serves now."""
    return public_key(tb.host_dir(host) / "hostkey.pub")


def new_key(path: Path, comment: str = "ablate-test") -> str:
    """A fresh unencrypted ed25519 key pair at `path`; `kind base64` of its public half."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)
    return public_key(Path(f"{path}.pub"))


def known_names(known: Path, name: str) -> list[str]:
    """The key lines `ssh-keygen -F name` finds in `known` (hashed entries included)."""
    p = subprocess.run(["ssh-keygen", "-F", name, "-f", str(known)], capture_output=True, text=True)
    return [line for line in p.stdout.splitlines() if line and not line.startswith("#")]


_WORD = r"(\"[^\"]*\"|'[^']*'|[^\s'\"`]+)"
_KEYGEN = re.compile(rf"ssh-keygen -f {_WORD} -R {_WORD}")


def keygen_hint(message: str) -> str:
    """The `ssh-keygen -f FILE -R NAME` command in an error message (quoted as it was)."""
    m = _KEYGEN.search(message)
    assert m, f"no `ssh-keygen -f FILE -R NAME` in: {message}"
    return m.group(0)


def passwd_home() -> Path:
    """The home OpenSSH takes `~/.ssh/config` and `~/.ssh/known_hosts` from: the passwd entry's
    (/root for root), whatever $HOME says."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


@contextlib.contextmanager
def ssh_dir(home: Path) -> Iterator[Path]:
    """`home`/.ssh; removed afterwards when it did not exist and is empty again (`ssh` without -F
    creates the passwd home's)."""
    path = home / ".ssh"
    existed = path.exists()
    path.mkdir(mode=0o700, exist_ok=True)
    try:
        yield path
    finally:
        if not existed:
            with contextlib.suppress(OSError):
                path.rmdir()


@contextlib.contextmanager
def ssh_dir_file(home: Path, name: str, text: str) -> Iterator[Path]:
    """`home`/.ssh/`name` holding `text` (a name no one else uses), removed afterwards."""
    with ssh_dir(home) as d:
        path = d / name
        assert not path.exists(), path
        path.write_text(text)
        path.chmod(0o600)
        try:
            yield path
        finally:
            path.unlink()


@contextlib.contextmanager
def ssh_agent() -> Iterator[str]:
    """A real ssh-agent in the foreground on a short socket path of its own; its SSH_AUTH_SOCK."""
    sock_dir = tempfile.mkdtemp(prefix="ab-agent-")
    sock = os.path.join(sock_dir, "agent.sock")
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, timeout=10)
        assert proc.poll() is None, f"ssh-agent exited {proc.returncode}"
        yield sock
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(sock_dir, ignore_errors=True)


def log_since(path: Path, offset: int) -> str:
    """What an sshd log gained after `offset` bytes."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def shell(command: str) -> subprocess.CompletedProcess[str]:
    """`sh -c command`: a hint pasted into a shell."""
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)


def quoted(path: Path | str) -> str:
    return shlex.quote(str(path))
