"""ablate's command server (ablate/cmdserver): a command it serves does and says what the same command
does in a process of its own, with the client's directory, environment and signals; a server serves
only the code, the user and the world it was started for; once the request is out, a lost server is
the command's failure, never a second run."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ablate.cmdserver import client
from ablate.cmdserver.server import Request, _same_user
from tests.helpers.cli import REPO
from tests.helpers.project import LocalProject
from tests.helpers.wait import wait_for


@pytest.fixture
def run_dir() -> Iterator[str]:
    """A short XDG_RUNTIME_DIR of the test's own (a socket's path is at most ~100 bytes); the servers
    started under it are ended afterwards."""
    d = tempfile.mkdtemp(prefix="acs-", dir="/tmp")
    yield d
    for pid in _servers(d):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)


def _servers(run_dir: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if run_dir.encode() in cmdline and b"ablate.cmdserver.server" in cmdline:
                out.append(int(entry))
    return out


def _env(run_dir: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "ABLATE_CMDSERVER": "1", "XDG_RUNTIME_DIR": run_dir,
            **extra}


def launcher(run_dir: str) -> list[str]:
    """`ablate` as pip installs it: a script in a bin directory (its directory first on sys.path,
    whatever the working directory: `python -m` puts the working directory there instead)."""
    script = Path(run_dir) / "bin" / "ablate"
    if not script.exists():
        script.parent.mkdir()
        script.write_text("import sys\nfrom ablate.cmdserver.client import main\nsys.exit(main())\n")
    return [sys.executable, str(script)]


def ablate(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*launcher(env["XDG_RUNTIME_DIR"]), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def serving(run_dir: str) -> Path:
    """The socket of the one server under `run_dir`, once it answers."""
    where = Path(run_dir) / "ablate-cmdserver"

    def up() -> Path | None:
        for sock in where.glob("*.sock"):
            conn = client.greeted(str(sock), sock.stem)
            if conn is not None:
                conn.close()
                return sock
        return None

    found = wait_for(up, timeout=60, interval=0.05)
    assert isinstance(found, Path)
    return found


def test_a_served_command_does_and_says_what_it_does_alone(tmp_path: Path, run_dir: str) -> None:
    """The first command runs in its own process and starts a server; each one after it is served (a
    forked child of the server: `served` in its timings) and prints, exits and writes what it does
    without a server, from the client's directory and with the client's environment."""
    p = LocalProject(tmp_path / "p")
    p.root.mkdir()
    for name in ("a", "b", "c"):
        p.cfg(f"configs/{name}.yaml", seed=ord(name))
    p.write_config(cells=[{"glob": "configs/*.yaml", "task": "recon"}])
    served = _env(run_dir)
    alone = {**served, "ABLATE_CMDSERVER": "0"}
    first = ablate(["--version"], served)
    assert first.returncode == 0 and first.stdout.startswith("ablate, version")
    serving(run_dir)
    proj = str(p.root)
    for args, cwd in ((["--version"], None), (["nosuch"], None), (["-C", proj, "plan", "--json"], None),
                      (["plan"], p.root), (["-C", str(tmp_path / "none"), "plan"], None)):
        timings = tmp_path / "timings.jsonl"
        timings.unlink(missing_ok=True)
        shutil.rmtree(p.root / "queues", ignore_errors=True)
        got = ablate(args, {**served, "ABLATE_TIMINGS": str(timings)}, cwd)
        queues = sorted((p.root / "queues").glob("*.txt"))
        written = {q.name: q.read_bytes() for q in queues}
        shutil.rmtree(p.root / "queues", ignore_errors=True)
        want = ablate(args, alone, cwd)
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), args
        assert written == {q.name: q.read_bytes() for q in sorted((p.root / "queues").glob("*.txt"))}
        # the child read ABLATE_TIMINGS from the client's environment (the server never had it)
        assert '"served"' in timings.read_text(), args
    assert len(_servers(run_dir)) == 1  # one server for all of them


@pytest.mark.tmux
def test_signals_reach_the_served_command_and_its_end_is_the_clients(local_project: LocalProject,
                                                                       run_dir: str) -> None:
    """Ctrl-C to the client ends the served `status --watch` as it ends alone (130); a served
    command killed outright ends its client by the same signal; SIGHUP ignored by the client (nohup)
    is ignored by the command too."""
    env = _env(run_dir)
    ablate(["--version"], env)
    serving(run_dir)
    server = _servers(run_dir)[0]

    def watch(preexec: Callable[[], object] | None = None) -> tuple[subprocess.Popen[str], int]:
        proc = subprocess.Popen([*launcher(run_dir), "-C", str(local_project.root), "status",
                                 "--watch", "--interval", "0.2"], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=preexec)
        child = wait_for(lambda: _children(server), timeout=30)
        assert isinstance(child, list) and len(child) == 1
        return proc, child[0]

    proc, child = watch(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    assert proc.stdout.readline()  # the dashboard is up
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    wait_for(lambda: not _children(server), timeout=30)

    # Ignored by the client (nohup): neither it nor the command ends by it. Pending signals come in
    # the order of their numbers, SIGHUP (1) before SIGINT (2): had either not ignored it, it would
    # have ended by SIGHUP, not by the Ctrl-C after it.
    proc, child = watch(lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL),
                                 signal.signal(signal.SIGHUP, signal.SIG_IGN)))
    assert proc.stdout is not None and proc.stdout.readline()
    os.kill(child, signal.SIGHUP)
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    wait_for(lambda: not _children(server), timeout=30)

    proc, child = watch()
    assert proc.stdout is not None and proc.stdout.readline()
    os.kill(child, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_a_server_lost_after_the_request_is_a_failure_not_a_second_run(tmp_path: Path, run_dir: str) -> None:
    """A server that greets, takes the request and goes away: the command may have run there, so
    the client says so and exits 3, and does not run it itself (nothing on stdout). One that does not
    greet for this code is passed over: the command runs in the client's process."""
    env = _env(run_dir)
    ablate(["--version"], env)
    sock = serving(run_dir)
    for pid in _servers(run_dir):
        os.kill(pid, signal.SIGKILL)
    sock.unlink()

    def fake(hello: bytes) -> threading.Thread:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(sock))
        listener.listen(1)

        def one() -> None:
            conn, _ = listener.accept()
            conn.sendall(hello)
            _data, fds, _f, _a = socket.recv_fds(conn, 1 << 16, 3)
            for fd in fds:
                os.close(fd)
            conn.close()
            listener.close()
            sock.unlink()

        t = threading.Thread(target=one, daemon=True)
        t.start()
        return t

    t = fake(client.PROTOCOL + b" " + sock.stem.encode() + b"\n")
    got = ablate(["--version"], env)
    t.join(timeout=30)
    assert got.returncode == 3 and got.stdout == "", got
    assert "the command server ended before the command did" in got.stderr

    fake(client.PROTOCOL + b" 0000000000000000\n")  # another code's server: passed over
    got = ablate(["--version"], env)
    assert got.returncode == 0 and got.stdout.startswith("ablate, version"), got


def test_the_fingerprint_follows_the_code(tmp_path: Path) -> None:
    """A file of the package changed (its mtime or size), added or removed is another fingerprint:
    a server never serves code other than what it loaded."""
    pkg = tmp_path / "ablate"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    path = [str(tmp_path)]
    first = client.fingerprint(str(pkg), path)
    assert client.fingerprint(str(pkg), path) == first and len(first) == 16
    os.utime(pkg / "a.py", ns=(1, 1))
    second = client.fingerprint(str(pkg), path)
    (pkg / "sub" / "c.py").write_text("")
    third = client.fingerprint(str(pkg), path)
    (pkg / "sub" / "c.py").unlink()
    assert len({first, second, third, client.fingerprint(str(pkg), path)}) == 3  # the last is the second
    assert client.fingerprint(str(pkg), [*path, "/nonexistent"]) != second
    # a package installed in a later entry of sys.path changes it; a file in the first does not
    site = tmp_path / "site"
    site.mkdir()
    before = client.fingerprint(str(pkg), [str(tmp_path), str(site)])
    (tmp_path / "notes.txt").write_text("")
    assert client.fingerprint(str(pkg), [str(tmp_path), str(site)]) == before
    os.utime(site, ns=(5, 5))
    assert client.fingerprint(str(pkg), [str(tmp_path), str(site)]) != before


def test_the_socket_directory_is_the_users_own_and_private(tmp_path: Path) -> None:
    base = tmp_path / "run"
    base.mkdir()
    where = client.socket_dir({"XDG_RUNTIME_DIR": str(base)})
    assert where == str(base / "ablate-cmdserver") and os.stat(where).st_mode & 0o777 == 0o700
    os.chmod(where, 0o755)
    assert client.socket_dir({"XDG_RUNTIME_DIR": str(base)}) is None
    os.rmdir(where)
    os.symlink(tmp_path, where)
    assert client.socket_dir({"XDG_RUNTIME_DIR": str(base)}) is None
    assert client.socket_dir({}) == f"/tmp/ablate-cmdserver-{os.getuid()}" or os.getuid() != 0
    a, b = socket.socketpair(socket.AF_UNIX)
    assert _same_user(a)
    a.close()
    b.close()


def test_the_request_carries_what_the_command_needs() -> None:
    """Arguments and environment values with spaces, `=` and non-UTF-8 bytes; the ignored signals."""
    argv = ["/x/ablate", "-C", "a dir", "status", "--json", "caf\udce9"]
    env = {"A": "1=2", "EMPTY": "", "PATH": "/bin:/usr/bin"}
    stdio = [("utf-8", "strict", False), ("utf-8", "strict", True), ("latin-1", "backslashreplace", True)]
    data = client.request("/work dir", 0o027, argv, env, stdio, [1, 2])
    req = Request(data[4:])
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert (req.cwd, req.umask, req.argv, req.env, req.stdio, req.ignored) == (
        "/work dir", 0o027, argv, env, stdio, [1, 2])
    with pytest.raises(ValueError):
        Request(b"ablate-cmdserver 0\0/\0" + b"0\0" * 12)


@pytest.mark.parametrize(("value", "platform", "on"), [
    ("", "linux", True), ("", "darwin", False), ("1", "darwin", True), ("0", "linux", False),
    ("off", "linux", False), ("yes", "darwin", True)])
def test_where_the_server_is_used(value: str, platform: str, on: bool) -> None:
    assert client.enabled({client.ENV: value} if value else {}, platform) is on
