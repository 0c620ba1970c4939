"""The host agent (ablate/remote/host/agent.py, ablate/transport/agentlink.py): on this machine for its
protocol, on the test bed for how the ssh transport starts and uses it, and for what happens when it
cannot be used: commands still run, each exactly once."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ablate.errors import FSError
from ablate.remote.host.agent import HELLO
from ablate.transport.agentlink import (
    SILENT_RETRY,
    AgentLive,
    AgentLost,
    Marks,
    agent_code,
    bootstrap,
    remote_socket,
    request,
)
from ablate.transport.shellhost import HostUnreachable, Live, ShellHost
from ablate.transport.ssh import SSHHost
from ablate.transport.sshfs import SSHFS, probe_command, probe_lib
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

# They time a silent agent's seconds-long window, which another worker's load stretches.
pytestmark = pytest.mark.alone

AGENT = str(Path(__file__).resolve().parents[1] / "ablate" / "remote" / "host" / "agent.py")
# the process chain above the command, one command line per line ($$ first)
CHAIN = ("p=$$; while [ \"$p\" -gt 1 ]; do tr '\\0' ' ' < /proc/$p/cmdline; echo; "
         "p=$(cut -d' ' -f4 < /proc/$p/stat); done")


# --------------------------------------------------------------------------- the agent itself


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[str]:
    """An agent of this machine's user, on a socket in a fresh private directory."""
    d = tmp_path / "agent"
    path = str(d / "a.sock")
    r = subprocess.run([sys.executable, "-I", "-S", AGENT, path, "30"], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: _answers(path), 10)
    yield path
    subprocess.run(["pkill", "-f", f"{AGENT} {path}"], check=False)


def _answers(path: str) -> bool:
    try:
        return request(path, "true", timeout=5, hello_within=5) is not None
    except (AgentLost, OSError):
        return False


def test_the_agent_runs_a_command_with_its_stdin_output_and_exit_code(agent: str) -> None:
    got = request(agent, "cat; echo to-err >&2; echo \"$(pwd)\"; exit 7", timeout=10, hello_within=5,
                  stdin=b"line\n" * 1000)
    assert got is not None
    rc, out, err = got
    assert (rc, err) == (7, b"to-err\n")
    assert out == b"line\n" * 1000 + (os.path.expanduser("~") + "\n").encode()


def test_a_command_past_its_timeout_is_ended_with_its_process_group(agent: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    got = request(agent, f"sleep 60 & echo $! > {pidfile}; wait", timeout=1, hello_within=5)
    assert got is not None and got[0] == 124 and b"timed out" in got[2]
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10))  # type: ignore[arg-type]
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def test_a_second_agent_leaves_the_first_one_serving(agent: str) -> None:
    r = subprocess.run([sys.executable, "-I", "-S", AGENT, agent, "30"], capture_output=True, timeout=30)
    assert r.returncode == 0
    assert request(agent, "echo still", timeout=5, hello_within=5) == (0, b"still\n", b"")


def test_no_agent_in_a_directory_others_can_write(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    r = subprocess.run([sys.executable, "-I", "-S", AGENT, str(d / "a.sock"), "30"], capture_output=True,
                       timeout=30)
    assert r.returncode == 2 and not (d / "a.sock").exists()


def test_an_idle_agent_exits_and_removes_its_socket(tmp_path: Path) -> None:
    path = tmp_path / "idle" / "a.sock"
    subprocess.run([sys.executable, "-I", "-S", AGENT, str(path), "1"], check=True, timeout=30)
    wait_for(path.exists, 10)
    wait_for(lambda: not path.exists(), 20)


def test_no_hello_means_nothing_was_sent(tmp_path: Path) -> None:
    """A socket that closes without the hello (the master found no agent behind its forward):
    `request` answers None, and the caller runs the command the usual way."""
    path = str(tmp_path / "mute.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    got: list[bytes] = []

    def close_at_once() -> None:
        conn, _ = srv.accept()
        conn.settimeout(2)
        try:
            got.append(conn.recv(100))
        except TimeoutError:
            got.append(b"")
        conn.close()

    import threading

    t = threading.Thread(target=close_at_once)
    t.start()
    assert request(path, "touch /tmp/never", timeout=5, hello_within=5) is None
    t.join()
    srv.close()
    assert HELLO and got == [b"\n"]  # a blank line, which an agent skips, and no request
    assert request(str(tmp_path / "absent.sock"), "true", timeout=5, hello_within=5) is None


def _raw(agent: str, data: bytes) -> socket.socket:
    """A connection to the agent past its hello, `data` sent at once after it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(agent)
    s.settimeout(10)
    s.sendall(data)
    hello = b""
    while len(hello) < len(HELLO):
        hello += s.recv(len(HELLO) - len(hello))
    assert hello == HELLO
    return s


def test_blank_lines_before_the_header_are_skipped_and_the_stdin_after_it_is_whole(agent: str) -> None:
    """The header line is read up to its newline only: stdin sent in the same write stays stdin."""
    s = _raw(agent, b"\n\n" + json.dumps({"cmd": "cat", "stdin": 5}).encode() + b"\nhello")
    reply = b""
    while not reply.endswith(b"x\0\0\0\x010"):
        chunk = s.recv(1 << 16)
        assert chunk, reply
        reply += chunk
    s.close()
    assert reply == b"o\0\0\0\x05hello" + b"x\0\0\0\x010"


def test_a_short_commands_output_comes_with_its_exit_code_in_one_write(agent: str) -> None:
    """Over ssh a second small write waits for the first one's delayed ACK (~40 ms): the agent
    holds a short command's output and sends it with the exit code."""
    s = _raw(agent, b"\n" + json.dumps({"cmd": "printf a; sleep 0.05; printf b >&2; exit 3",
                                        "stdin": None}).encode() + b"\n")
    first = s.recv(1 << 16)  # waits for the first write the agent makes
    s.close()
    assert first == b"o\0\0\0\x01a" + b"e\0\0\0\x01b" + b"x\0\0\0\x013"


def test_a_long_commands_output_is_not_held_until_it_ends(agent: str, tmp_path: Path) -> None:
    """What a command prints goes to the sink within the hold (0.2 s), not at its end."""
    done = tmp_path / "done"
    early: list[bool] = []

    class Sink:
        def write(self, data: bytes) -> None:
            early.append(not done.exists())

    got = request(agent, f"echo first; sleep 3; touch {done}; echo last", timeout=20, hello_within=5,
                  sink=Sink())
    assert got is not None and got[0] == 0
    assert early[0] is True and done.exists()


def _lib(tmp_path: Path) -> str:
    """The probe's library as a host holds it (`lib/<sha12>/` on the FS)."""
    lib = tmp_path / "lib"
    for rel, data in probe_lib().items():
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (lib / rel).write_bytes(data)
    return str(lib)


def _py(lib: str, entry: str, *argv: str) -> dict[str, object]:
    return {"dir": lib, "entry": entry, "argv": list(argv), "needs": "ablate/remote/host/probe.py",
            "min": [3, 8]}


# what the entry prints: whether it runs inside the agent's process image (forked, never exec'd:
# the agent's `python -I -S` command line, where the shell form runs `python -S -c`)
INSIDE = ("import sys; print('-I' in open('/proc/self/cmdline').read().split('\\0'), sys.argv[1:], "
          "sys.path[0])\n")


def test_a_python_entry_runs_in_the_agent_itself_with_stdin_output_and_exit_code(
        agent: str, tmp_path: Path) -> None:
    """`py` beside a command: the agent runs the entry in a forked child of its own (the command,
    here a different one on purpose, does not run), with stdin, both streams and the exit code."""
    lib = _lib(tmp_path)
    entry = INSIDE + "data = sys.stdin.read(); print(len(data)); print('err', file=sys.stderr); sys.exit(5)"
    got = request(agent, "exit 42", timeout=10, hello_within=5, stdin=b"x" * 200_000,
                  py=_py(lib, entry, "a", "b c"))
    assert got == (5, f"True ['a', 'b c'] {lib}\n200000\n".encode(), b"err\n")
    got = request(agent, "exit 42", timeout=10, hello_within=5, py=_py(lib, "raise ValueError('no')"))
    assert got is not None and got[0] == 1 and got[2].rstrip().endswith(b"ValueError: no")
    assert request(agent, "exit 42", timeout=10, hello_within=5, py=_py(lib, "pass")) == (0, b"", b"")


def test_a_python_entry_the_agent_cannot_run_goes_the_usual_way(agent: str, tmp_path: Path) -> None:
    lib = _lib(tmp_path)
    for py in (_py(str(tmp_path / "absent"), INSIDE), {**_py(lib, INSIDE), "min": [99, 0]},
               {**_py(lib, INSIDE), "argv": [1]}, {"dir": lib}):
        assert request(agent, "echo usual; exit 3", timeout=10, hello_within=5, py=py) == (3, b"usual\n", b"")


def test_a_probe_answers_the_same_in_the_agent_as_through_its_command(agent: str, tmp_path: Path) -> None:
    lib = _lib(tmp_path)
    root = tmp_path / "sweep"
    (root / "queues").mkdir(parents=True)
    (root / "queues" / "q1.txt").write_text("# ablate: host=h1\nconfigs/a.yaml t\n")
    command, py = probe_command(lib, "", sys.executable, "queues", json.dumps({"root": str(root)}))
    assert py is not None
    usual = request(agent, command, timeout=20, hello_within=5)
    inside = request(agent, "exit 42", timeout=20, hello_within=5, py=py)
    assert usual == inside and usual is not None and usual[0] == 0
    assert json.loads(usual[1])["queues"]
    assert probe_command(lib, "", sys.executable, "verify", "{}")[1] is None  # site-packages: a command


class _Local(ShellHost):
    """This machine as a host for SSHFS: with `how` "agent" its agent runs a request's `py` (the
    command sent is `exit 42`, so only the entry can succeed), "command" its agent runs the command,
    "script" no agent: the command through a shell here."""

    name, tmux_socket = "local", None

    def __init__(self, agent: str, how: str) -> None:
        self.agent, self.how = agent, how
        self.sent: list[Any] = []

    def agent_runs(self, python: str) -> bool:
        return self.how != "script"

    def exec(self, command: str, *, timeout: float = 60.0, stdin: bytes | None = None,
             sink: Any = None, py: Any = None) -> tuple[int, bytes, bytes]:
        self.sent.append(py)
        if self.how == "script":
            r = subprocess.run(["sh", "-c", command], input=stdin or b"", capture_output=True,
                               timeout=timeout)
            return r.returncode, r.stdout, r.stderr
        got = request(self.agent, "exit 42" if self.how == "agent" else command, timeout=timeout,
                      hello_within=5, stdin=stdin, py=py if self.how == "agent" else None)
        assert got is not None
        return got

    def open_live(self, command: str, *, timeout: float = 60.0) -> Live:
        raise AssertionError("not used")

    def target(self) -> str:
        return "local"


@pytest.mark.parametrize("how", ["agent", "command", "script"])
def test_the_probe_library_is_placed_alike_by_the_agent_its_command_and_the_shell_script(
        agent: str, tmp_path: Path, how: str) -> None:
    """Where the host's agent runs, fsops places the library in one forked Python; its command
    does the same where the agent cannot run the entry; with no agent, the shell script, with no
    Python. All three: every file 0444 with its bytes and nothing else, again at once, and a name
    taken by other bytes refused, naming it, with the probe (placed last) never placed."""
    host = _Local(agent, how)
    fs = SSHFS(host, str(tmp_path / "sweep"), python=sys.executable)
    fs.ship_probe()
    lib = Path(fs.lib_dir)
    assert sorted(str(f.relative_to(lib)) for f in lib.rglob("*") if f.is_file()) == sorted(probe_lib())
    for rel, data in probe_lib().items():
        assert (lib / rel).read_bytes() == data and stat.S_IMODE((lib / rel).stat().st_mode) == 0o444
    assert (host.sent[0] is not None) is (how != "script")
    fs.ship_probe()  # the same bytes there already: nothing to do, no error

    other = SSHFS(host, str(tmp_path / "other"), python=sys.executable)
    taken = Path(other.lib_dir) / "ablate" / "remote" / "host" / "fs_writes.py"
    taken.parent.mkdir(parents=True)
    taken.write_bytes(b"# other bytes\n")
    with pytest.raises(FSError, match=r"creating .*/ablate/remote/host/fs_writes\.py.*other content"):
        other.ship_probe()
    assert taken.read_bytes() == b"# other bytes\n"
    assert not (taken.parent / "probe.py").exists()
    assert [f.name for f in taken.parent.iterdir() if f.name.startswith(".")] == []


def test_a_python_entry_past_its_timeout_is_ended_with_its_process_group(agent: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    entry = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    got = request(agent, "exit 42", timeout=1, hello_within=5, py=_py(_lib(tmp_path), entry))
    assert got is not None and got[0] == 124
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10))  # type: ignore[arg-type]
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10)


# --------------------------------------------------------------------------- over ssh, on the test bed


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A control directory of its own: no master of another test is reused. Short, under /tmp: a
    socket's path must fit in 108 bytes, and pytest-xdist's tmp_path is longer than that allows."""
    ctl = Path(tempfile.mkdtemp(prefix="actl-", dir="/tmp"))
    monkeypatch.setenv("ABLATE_SSH_CONTROL_DIR", str(ctl))
    monkeypatch.delenv("ABLATE_SSH_AGENT", raising=False)
    monkeypatch.delenv("ABLATE_SSH_PERSIST", raising=False)
    yield ctl
    shutil.rmtree(ctl, ignore_errors=True)


def _on(tb: Testbed, host: str, command: str) -> str:
    return subprocess.run(tb.ssh_argv(host, command), capture_output=True, text=True, timeout=30,
                          check=True).stdout


def _agent_serves(tb: Testbed, host: str) -> bool:
    path = remote_socket("root")
    assert path is not None
    return _on(tb, host, f"test -S {path} && echo yes || true").strip() == "yes"


@pytest.fixture
def no_agents(testbed: Testbed) -> Iterator[None]:
    """Start and end with no agent on the bed (one may be left by another test's command)."""
    for h in testbed.hosts:
        _on(testbed, h, "pkill -f 'ablate[_]agent' || true")
    yield
    for h in testbed.hosts:
        _on(testbed, h, "pkill -f 'ablate[_]agent' || true; rm -rf /tmp/ablate-agent-root /tmp/count")


def test_the_first_command_starts_the_agent_and_later_ones_use_it(testbed: Testbed, fresh: Path,
                                                                  no_agents: None) -> None:
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    chain = first.run(["sh", "-c", CHAIN]).check().stdout
    assert "sshd" in chain and "ablate_agent" not in chain  # the usual way: sshd, a login shell
    assert _agent_serves(testbed, "tb-h1")  # started before that command, listening already
    chain = first.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain  # this process's next command
    first.close()

    later = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))  # the next ablate command
    chain = later.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain  # no session, no login shell
    r = later.run(["sh", "-c", "cat; echo e >&2; exit 5"], stdin=b"x" * 100_000)
    assert (r.rc, r.stdout, r.stderr) == (5, "x" * 100_000, "e\n")
    assert [n for n in os.listdir(fresh) if n.endswith(".a")]  # the master's forward, beside it
    assert later.run(["sh", "-c", "echo $SHLVL"]).check().stdout == "1\n"  # as under a login shell
    later.close()


def test_a_new_connection_uses_the_agent_still_running_there(testbed: Testbed, fresh: Path,
                                                             no_agents: None) -> None:
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    second = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    second.run(["true"]).check()  # through the agent: remembered here for the next connection
    old = second.master_pid()
    second.disconnect()  # the ControlMaster ends (ControlPersist ran out)
    wait_for(lambda: old is not None and not Path(f"/proc/{old}").exists(), 10)

    third = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    chain = third.run(["sh", "-c", CHAIN]).check().stdout
    assert third.master_pid() not in (None, old)  # a new connection...
    assert "ablate_agent" in chain and "sshd" not in chain  # ...and still no login shell


def test_over_ssh_a_probe_runs_inside_the_host_agent_once_one_answers(
        testbed: Testbed, fresh: Path, no_agents: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `py` form goes with the command through the ssh transport: the host's agent runs the
    entry itself (the command, a different one on purpose, does not run); before any agent
    answers, and with ABLATE_SSH_AGENT_PY=0, the command runs."""
    lib = _lib(testbed.shared_dir / "agentpy")  # the shared dir: the host sees it at shared_path
    on_host = lib.replace(str(testbed.shared_dir), testbed.shared_path)
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    py = {**_py(on_host, INSIDE, "x"), "python": host.python}  # the one the agent runs on
    assert not host.agent_ready()  # nothing says an agent is there: a view stays in the script
    assert host.exec("echo usual; exit 42", py=py)[:2] == (42, b"usual\n")  # a login shell (it boots one)
    assert host.agent_ready()
    assert host.exec("exit 42", py=py)[:2] == (0, f"True ['x'] {on_host}\n".encode())
    other = {**py, "python": "/opt/other/python3"}  # the probe asks for another interpreter
    assert host.exec("echo usual; exit 42", py=other)[:2] == (42, b"usual\n")
    monkeypatch.setenv("ABLATE_SSH_AGENT_PY", "0")
    assert host.exec("echo usual; exit 42", py=py)[:2] == (42, b"usual\n")
    host.close()


def test_a_command_sent_while_another_starts_the_agent_goes_to_it(
        testbed: Testbed, fresh: Path, no_agents: None, tmp_path: Path) -> None:
    """First contact, two commands at once (status's FS probe and its host query): the second waits
    for the first to start, the agent's news with it, then goes to the agent; never a second login
    shell, and never the first command's end (it still runs when the second is done)."""
    import threading

    marker = f"/tmp/abl-first-{os.getpid()}"
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first: list[str] = []
    t = threading.Thread(target=lambda: first.append(host.run(
        ["sh", "-c", CHAIN + f"; sleep 3; touch {marker}"], timeout=60).check().stdout))
    t.start()
    wait_for(lambda: host._agent_booted, 20)  # the first command carries the agent's start
    second = host.run(["sh", "-c", CHAIN + f"; test ! -e {marker} && echo first-still-running"],
                      timeout=60).check().stdout
    t.join(60)
    _on(testbed, "tb-h1", f"rm -f {marker}")
    assert "sshd" in first[0] and "ablate_agent" not in first[0]
    assert "ablate_agent" in second and "sshd" not in second
    assert "first-still-running" in second
    host.close()


def test_a_host_connected_ahead_has_its_master_and_agent_before_its_first_command(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """`launch` connects to its hosts while it takes the lock through the shared FS's host
    (`transport.connect_ahead`, `SSHHost.warm`): the master and the agent are up before any
    command is asked there, and the first command goes to the agent (the one login shell was the
    warm-up's), as it does after warming up a new connection to an agent already running; where
    the master and the agent are there already, warming up sends nothing."""
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    host.warm()
    assert host.master_pid() is not None and _agent_serves(testbed, "tb-h1")
    chain = host.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain
    host.disconnect()
    host.close()

    again = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))  # a next command, new connection
    again.warm()
    assert again.master_pid() is not None
    chain = again.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain

    third = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))  # its master and agent are there
    third.run = lambda *a, **k: pytest.fail("warm sent a command where nothing was to be gained")  # type: ignore[method-assign]
    third.warm()
    again.close()


def test_a_held_command_at_first_contact_starts_the_agent_for_the_next_ones(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """launch's first command on the shared-FS host is the controller lock, held open: it carries
    the agent's start, so the commands after it go to the agent, not through login shells."""
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    live = host.open_live("echo held; cat")
    assert b"held" in _read_until(live, b"held")
    chain = host.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain
    live.shutdown_write()
    _read_until(live, b"never printed")  # read to the end: it ends once its stdin is closed
    assert live.exit_status() == 0
    live.close()
    host.close()


def _read_until(live: Live, text: bytes, timeout: float = 20.0) -> bytes:
    got = [b""]

    def seen() -> bool:
        got[0] += live.read(0.1)[0]
        return text in got[0] or live.exit_status() is not None

    wait_for(seen, timeout)
    return got[0]


def test_a_held_command_goes_through_the_agent_and_ends_as_a_closed_session_would(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """`open_live` (what holds the controller lock): its stdin stays open until `shutdown_write`,
    and closing it gives the command EOF first, so it cleans up as when an ssh session closes."""
    h = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    h.run(["true"]).check()  # starts the agent
    live = h.open_live("echo ready; cat > /tmp/count; echo after")
    assert isinstance(live, AgentLive)
    assert b"ready" in _read_until(live, b"ready")
    live.shutdown_write()
    assert b"after" in _read_until(live, b"after")
    wait_for(lambda: live.exit_status() == 0, 10)
    live.close()

    live = h.open_live("echo ready; cat; echo cleaned > /tmp/count")
    assert b"ready" in _read_until(live, b"ready")
    live.close()  # the controller dies: EOF, and it ends on its own
    wait_for(lambda: _on(testbed, "tb-h1", "cat /tmp/count").strip() == "cleaned", 10)


def _count_once(tb: Testbed, hosts: list[SSHHost]) -> None:
    """Each host object appends one line on tb-h1; the file then has exactly one line per call."""
    for i, h in enumerate(hosts):
        h.run(["sh", "-c", f"echo {i} >> /tmp/count"]).check()
    assert _on(tb, "tb-h1", "cat /tmp/count").split() == [str(i) for i in range(len(hosts))]


def test_where_sshd_refuses_the_forward_commands_go_the_usual_way_once(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    testbed.configure_sshd("tb-h1", "AllowStreamLocalForwarding no\n")
    hosts = [SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)) for _ in range(3)]
    _count_once(testbed, hosts)  # the 1st starts an agent; the 2nd finds it out of reach
    assert [n for n in os.listdir(fresh) if n.endswith(".refused")]  # so the 3rd did not try


def test_a_host_without_the_python_runs_commands_the_usual_way_once(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    hosts = [SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), python="/nonexistent/python3")
             for _ in range(3)]
    _count_once(testbed, hosts)
    assert not _agent_serves(testbed, "tb-h1") and not any(h._agent_up for h in hosts)
    assert [n for n in os.listdir(fresh) if n.endswith(".refused")]  # tried once, not per command
    ahead = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), python="/nonexistent/python3")
    ahead.run = lambda *a, **k: pytest.fail("warm-up sent a command")  # type: ignore[method-assign]
    ahead.disconnect()
    ahead.warm()  # launch's connect_ahead: the master only, no login shell to start no agent
    assert ahead.master_pid() is not None


def test_an_agent_directory_someone_else_could_write_is_never_used(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    _on(testbed, "tb-h1", "mkdir -m 777 /tmp/ablate-agent-root")
    hosts = [SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)) for _ in range(3)]
    _count_once(testbed, hosts)
    assert not _agent_serves(testbed, "tb-h1") and not any(h._agent_up for h in hosts)


def test_an_agent_gone_between_commands_costs_nothing_twice(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    second = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    second.run(["true"]).check()
    assert second._agent_up
    _on(testbed, "tb-h1", "pkill -f 'ablate[_]agent'")
    wait_for(lambda: not _on(testbed, "tb-h1", "pgrep -f 'ablate[_]agent' || true").strip(), 10)
    third = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    _count_once(testbed, [second, third])  # second: its agent vanished (it starts one again)
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)


def test_a_kept_masters_silence_for_one_command_does_not_cut_another_under_way(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """A master left by an earlier command is unproven: a command that hears nothing through it for
    the connect time-out ends it (the host is taken for gone). Not when the host is busy, not gone:
    ending the master would cut the commands under way (CI once saw launch's FS probe end so: 'the
    connection dropped while running'). Here the host's agent is stopped for longer than that
    time-out while one command runs and another is sent; both end well, each run once."""
    import threading

    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    first.close()
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)  # silence: 3 s
    tag = f"/tmp/abl-kept-{os.getpid()}"
    got: dict[str, Any] = {}

    def long() -> None:
        try:
            got["a"] = host.run(["sh", "-c", f"echo a >>{tag}.runs; touch {tag}; sleep 4; echo A"],
                                timeout=60)
        except Exception as e:
            got["a"] = e

    t = threading.Thread(target=long)
    t.start()
    wait_for(lambda: _on(testbed, "tb-h1", f"test -e {tag} && echo y || true").strip() == "y", 20)
    _on(testbed, "tb-h1", "pkill -STOP -f 'ablate[_]agent'")
    resume = threading.Timer(5.0, lambda: _on(testbed, "tb-h1", "pkill -CONT -f 'ablate[_]agent'"))
    resume.start()
    try:
        b = host.run(["sh", "-c", f"echo b >>{tag}.runs; echo B"], timeout=60)
    finally:
        resume.join()
        _on(testbed, "tb-h1", "pkill -CONT -f 'ablate[_]agent' || true")
        t.join(60)
    runs = _on(testbed, "tb-h1", f"sort {tag}.runs; rm -f {tag} {tag}.runs")
    assert (b.rc, b.stdout) == (0, "B\n")
    assert not isinstance(got["a"], Exception), got["a"]
    assert (got["a"].rc, got["a"].stdout) == (0, "A\n")
    assert runs == "a\nb\n"
    assert host.master_pid() is not None
    host.close()


def test_a_host_object_of_an_ended_command_ends_no_master(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """connect_ahead's warm-up threads may outlive their command (in a process that runs several,
    as the tests do): one that then meets a silent link must not end the master under the next
    command, which uses the same master through a host object of its own (the link may come back
    before the master's keep-alives give up, as here)."""
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    first.run(["true"]).check()
    pid = first.master_pid()
    left = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)
    left.close()  # its command ended; a thread of it goes on below
    testbed.link_down("tb-h1")
    try:
        with pytest.raises(HostUnreachable):  # 3 s of silence on a kept master: the host seems gone
            left.run(["true"], timeout=30)
    finally:
        testbed.link_up("tb-h1")
    assert pid is not None and first.master_pid() == pid
    assert first.run(["echo", "ok"]).check().stdout == "ok\n"
    first.close()


def test_an_agent_that_takes_connections_but_never_answers_is_gone_around(
        testbed: Testbed, fresh: Path, no_agents: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped or hung agent (the forward reaches its socket, no hello ever comes) must not make
    its host unreachable while `ssh` reaches it: after half the time-out, a session the usual way
    starts, so the command goes that way (once); the next ones, of this process and the next,
    go there at once, never to the agent (`.refused`), for SILENT_RETRY seconds: then it is tried
    again, and, answering again, used."""
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    first.run(["true"]).check()
    first.close()
    tag = f"/tmp/abl-hung-{os.getpid()}"
    _on(testbed, "tb-h1", "pkill -STOP -f 'ablate[_]agent'")
    try:
        host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)
        chain = host.run(["sh", "-c", f"echo 1 >>{tag}; " + CHAIN]).check().stdout
        assert "sshd" in chain and "ablate_agent" not in chain
        assert host.master_pid() is not None
        monkeypatch.setattr("ablate.transport.ssh.request",
                            lambda *a, **k: pytest.fail("a command went to the silent agent again"))
        assert "sshd" in host.run(["sh", "-c", f"echo 2 >>{tag}; " + CHAIN]).check().stdout
        host.close()
        later = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)
        assert "sshd" in later.run(["sh", "-c", f"echo 3 >>{tag}; " + CHAIN]).check().stdout
        later.close()
    finally:
        _on(testbed, "tb-h1", "pkill -CONT -f 'ablate[_]agent' || true")
    marks = [fresh / n for n in os.listdir(fresh) if n.endswith(".refused")]
    assert len(marks) == 1 and marks[0].read_text() == "silent"
    aged = marks[0].stat().st_mtime - SILENT_RETRY - 1
    os.utime(marks[0], (aged, aged))  # the stall is over: the agent is tried again
    monkeypatch.setattr("ablate.transport.ssh.request", request)  # (not undo(): fresh's env stays)
    again = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)
    for i in (4, 5):  # tried again (over the kept master) and, answering, used
        assert "ablate_agent" in again.run(["sh", "-c", f"echo {i} >>{tag}; " + CHAIN]).check().stdout
    again.close()
    assert _on(testbed, "tb-h1", f"cat {tag}; rm -f {tag}") == "1\n2\n3\n4\n5\n"  # each ran once


def test_a_silent_agent_is_gone_around_for_a_while_and_a_refusing_host_for_an_idle_time(
        tmp_path: Path) -> None:
    silent, refusing = Marks(str(tmp_path / "a")), Marks(str(tmp_path / "b"))
    silent.started(True)
    silent.silent()
    refusing.started(False)  # no Python there, say
    assert silent.refused() and refusing.refused() and not silent.seen()
    for m, age in ((silent, SILENT_RETRY + 1), (refusing, SILENT_RETRY + 1)):
        t = os.stat(m.refused_path).st_mtime - age
        os.utime(m.refused_path, (t, t))
    assert not silent.refused() and refusing.refused()
    t = os.stat(refusing.refused_path).st_mtime - 3600
    os.utime(refusing.refused_path, (t, t))
    assert not refusing.refused()  # an idle time (the default hour) later, tried again


def test_the_agent_code_is_versioned_by_content() -> None:
    code = agent_code()
    assert remote_socket("root") == f"/tmp/ablate-agent-root/{code.version}.sock"
    assert remote_socket("bad user") is None and remote_socket("../x") is None


def test_the_agent_is_compiled_once_per_host_and_interpreter_and_a_bad_copy_is_compiled_again(
        tmp_path: Path) -> None:
    """The bootstrap keeps the agent's code object in the user's cache dir (a third of its start):
    a kept one is what runs; one that is damaged (cut short, another checksum) or of another
    interpreter is compiled again and replaced; without HOME, nothing is kept and the agent still
    starts."""
    import marshal
    import zlib

    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("XDG_CACHE_HOME", None)
    kept = (tmp_path / ".cache" / "ablate" / "agent" /
            f"{agent_code().version}-{sys.implementation.cache_tag}.bin")
    tag = sys.version.encode() + b"\0"

    def boot(n: int, environ: dict[str, str]) -> bytes:
        sock = str(tmp_path / f"a{n}" / "a.sock")
        r = subprocess.run(["sh", "-c", bootstrap(sys.executable, sock, 30) + "true"], env=environ,
                           capture_output=True, timeout=30)
        subprocess.run(["pkill", "-f", sock], check=False)
        return r.stderr

    assert boot(1, env) == b"ablate-agent: up\n"
    assert kept.read_bytes().startswith(tag)
    marker = marshal.dumps(compile("def main(argv):\n    print('ablate-agent: from the kept copy')\n"
                                   "    return 0\n", "kept", "exec"))

    def copy(tag: bytes, code: bytes) -> bytes:
        return tag + b"%08x" % zlib.crc32(code) + code

    kept.write_bytes(copy(tag, marker))
    assert boot(2, env) == b"ablate-agent: from the kept copy\n"
    for bad in (b"damaged", copy(b"Python 0.1\0", marker), copy(tag, marker)[:-3], copy(tag, b"\xff"),
                tag + b"%08x" % (zlib.crc32(marker) ^ 1) + marker):
        kept.write_bytes(bad)
        assert boot(3, env) == b"ablate-agent: up\n"
        assert kept.read_bytes().startswith(tag) and kept.read_bytes() != bad
    homeless = {k: v for k, v in env.items() if k != "HOME"}
    kept.unlink()
    assert boot(4, homeless) == b"ablate-agent: up\n" and not kept.exists()
