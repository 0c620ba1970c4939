"""`ssh -G`, remembered while nothing it was made of changed: one `ssh` process per host fewer for
every command after the first (each costs a process start and a parse of the user's configs, ~5 ms
of CPU: at 32 hosts, more than the rest of a warm `status`).

An entry is kept, in the private control directory (`sshproc.control_dir`), under a key of all it
can depend on besides files and the environment: the `ssh` binary (path, size, mtime), the config
given (`-F`), the alias, the user, the working directory, the host name. Of the environment, it
depends on the variables the configs it read name (`${VAR}`) and the few OpenSSH reads itself (HOME,
USER, LOGNAME, SSH_AUTH_SOCK): the entry holds their names and a digest of their values (never the
values), and is used only while they are the same; any other variable may change (a terminal's own,
OLDPWD after a `cd`, ABLATE_TIMINGS) without costing the next command an `ssh -G` per host. It holds
the signatures (mtime, size, inode) of every file OpenSSH read for it, as `ssh -v -G` names them, of
every directory an `Include` there names (a file added to `conf.d/` changes the directory), and,
with no `-F`, of `~/.ssh/config` whether there or not. A lookup stats them all and uses the entry
only when every one is as recorded.

Never kept, so `ssh -G` runs every time, where the answer depends on more than files: a `Match exec`
or `Match localnetwork` anywhere, host name canonicalisation, an `Include` whose directory has a
wildcard or a token, a file changed within the last seconds (it may have changed during the run).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import re
import shlex
import socket
import stat
import tempfile

from ablate.transport.sshproc import control_dir

VERSION = 2
SETTLE_NS = 2_000_000_000  # a file changed less than this before the run: not kept (coarse mtimes)
KEEP = 512  # entries; past it the older half goes
_READ = re.compile(r"^debug1: Reading configuration data (.+)$", re.M)
_INCLUDE = re.compile(r"^\s*include(?:\s*=\s*|\s+)(.*)$", re.I)
_MATCH_DYNAMIC = re.compile(r"^\s*match\b.*\b(exec|localnetwork)\b", re.I)
_GLOB = re.compile(r"[*?\[]")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# What OpenSSH's client reads of the environment besides `${VAR}`: kept answers follow them too.
OPENSSH_READS = frozenset({"HOME", "USER", "LOGNAME", "SSH_AUTH_SOCK"})

Sig = list[int] | None


def _sig(path: str) -> Sig:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino, stat.S_IFMT(st.st_mode)]


def _home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir  # what OpenSSH expands ~ to, not $HOME
    except KeyError:
        return os.path.expanduser("~")


def key(ssh: str, config: str | None, alias: str) -> str:
    st = os.stat(ssh)
    parts = [VERSION, os.path.realpath(ssh), st.st_size, st.st_mtime_ns, st.st_ino,
             os.path.abspath(config) if config else None, alias, os.getuid(), os.getcwd(),
             socket.gethostname()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def _env_digest(names: list[str]) -> str:
    """The named variables' values (unset is not empty), as a digest: an entry never holds them."""
    pairs = [[n, os.environ.get(n)] for n in sorted(names)]
    return hashlib.sha256(json.dumps(pairs).encode("utf-8", "surrogateescape")).hexdigest()


def _entry(k: str) -> str:
    return os.path.join(control_dir(), "resolved", f"{k}.json")


def lookup(ssh: str, config: str | None, alias: str) -> bytes | None:
    """The kept `ssh -G` output for these, when every file it was made of is as it was; else None."""
    try:
        with open(_entry(key(ssh, config, alias)), encoding="utf-8") as f:
            got = json.load(f)
        if got.get("v") != VERSION or any(_sig(path) != sig for path, sig in got["watch"]):
            return None
        if _env_digest([str(n) for n in got["env_names"]]) != got["env"]:
            return None
        return str(got["out"]).encode("utf-8", "surrogateescape")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(ssh: str, config: str | None, alias: str, out: bytes, verbose: bytes, started_ns: int) -> bool:
    """Keep `out` (what `ssh -v [-F config] -G -- alias` printed; `verbose`, its stderr) when it
    depends on files alone (the module's docstring); whether it was kept. Never raises: not
    keeping it only costs the next command an `ssh -G`."""
    with contextlib.suppress(OSError, ValueError):
        found = _watched(config, out.decode(errors="replace"), verbose.decode(errors="replace"))
        if found is None:
            return False
        watch, names = found
        sigs = [(path, _sig(path)) for path in sorted(watch)]
        if any(sig is not None and sig[0] > started_ns - SETTLE_NS for _, sig in sigs):
            return False
        env_names = sorted(names | OPENSSH_READS)
        doc = {"v": VERSION, "out": out.decode("utf-8", "surrogateescape"), "watch": sigs,
               "env_names": env_names, "env": _env_digest(env_names)}
        path = _entry(key(ssh, config, alias))
        folder = os.path.dirname(path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        _prune(folder)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
        return True
    return False


def _prune(folder: str) -> None:
    names = [n for n in os.listdir(folder) if n.endswith(".json")]
    if len(names) < KEEP:
        return
    aged = sorted(names, key=lambda n: os.stat(os.path.join(folder, n)).st_mtime)
    for name in aged[: len(aged) // 2]:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, name))


def _watched(config: str | None, out: str, verbose: str) -> tuple[set[str], set[str]] | None:
    """The paths whose signatures decide the entry, and the variables the configs name; None: not
    to be kept."""
    if re.search(r"^canonicalizehostname (?!false$)", out, re.M | re.I):
        return None
    home = _home()
    read = [os.path.abspath(p.strip()) for p in _READ.findall(verbose)]
    watch = set(read)
    names: set[str] = set()
    if config is None:
        watch.add(os.path.join(home, ".ssh", "config"))  # created later: another answer
        if not any(p != os.path.join(home, ".ssh", "config") for p in read):
            return None  # no system file read: where one would appear is not known here
    for path in read:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return None  # read by ssh, not by us: what it holds is not known
        dirs = _include_dirs(text, home, os.path.dirname(path))
        if dirs is None:
            return None
        watch |= dirs
        names |= set(_ENV_REF.findall(text))
    return watch, names


def _include_dirs(text: str, home: str, here: str) -> set[str] | None:
    """The directories the `Include` lines of one config file name; None where its answer can
    depend on more than files (`Match exec`/`localnetwork`, a pattern OpenSSH would expand)."""
    dirs: set[str] = set()
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if _MATCH_DYNAMIC.search(line):
            return None
        m = _INCLUDE.match(line)
        if m is None:
            continue
        try:
            patterns = shlex.split(m.group(1), comments=True)
        except ValueError:
            return None
        for pattern in patterns:
            other_home = pattern.startswith("~") and not pattern.startswith("~/")  # ~user/...
            if "%" in pattern or "${" in pattern or other_home:
                return None
            if pattern.startswith("~/"):
                pattern = os.path.join(home, pattern[2:])
            folder = os.path.dirname(pattern)
            if _GLOB.search(folder):
                return None
            if os.path.isabs(pattern):
                dirs.add(folder or "/")
            else:  # relative: to ~/.ssh in a user's file, to the system dir in the system's
                dirs |= {os.path.join(home, ".ssh", folder), os.path.join(here, folder)}
    return dirs


def chatter(stderr: bytes) -> str:
    """`ssh -v`'s stderr without its debug lines: what it said to the user."""
    lines = stderr.decode(errors="replace").splitlines()
    return "\n".join(ln for ln in lines if not ln.startswith(("debug", "OpenSSH_", "Pseudo-terminal")))
