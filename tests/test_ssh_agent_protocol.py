"""The host agent (ablate/remote/host/agent.py, ablate/transport/agentlink.py) on this machine, its
protocol: it runs a command with its stdin, output and exit code, ends one past its timeout with
its process group, leaves a running agent serving, refuses a directory others can write, exits
when idle; a socket without the hello means nothing was sent; a request's framing, and when its
output is sent (a short command's with its exit code in one write, a long one's as it comes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from ablate.remote.host.agent import HELLO, frame
from ablate.transport.agentlink import AgentLive, request
from tests.helpers.proc import with_args
from tests.helpers.ssh_agent import AGENT, agent_fixture
from tests.helpers.ssh_agent import is_zombie as _zombie
from tests.helpers.wait import wait_for

agent = agent_fixture()


def test_the_agent_runs_a_command_with_its_stdin_output_and_exit_code(agent: str) -> None:
    got = request(agent, "cat; echo to-err >&2; echo \"$(pwd)\"; exit 7", timeout=10, hello_within=5,
                  stdin=b"line\n" * 1000)
    assert got is not None
    rc, out, err = got
    assert (rc, err) == (7, b"to-err\n")
    assert out == b"line\n" * 1000 + (os.path.expanduser("~") + "\n").encode()


def test_a_command_past_its_timeout_is_ended_with_its_process_group(agent: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    # 2 s: the shell writes its pidfile first, well within them on a loaded machine too
    got = request(agent, f"sleep 60 & echo $! > {pidfile}; wait", timeout=2, hello_within=5)
    assert got is not None and got[0] == 124 and b"timed out" in got[2]
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10))  # type: ignore[arg-type]
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10)


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
    """`up` is said once the socket listens (looking for the file instead could come after its idle
    second on a loaded machine)."""
    path = tmp_path / "idle" / "a.sock"
    r = subprocess.run([sys.executable, "-I", "-S", AGENT, str(path), "1"], check=True, timeout=30,
                       capture_output=True)
    assert r.stdout == b"ablate-agent: up\n"
    wait_for(lambda: not path.exists() and not with_args(AGENT, str(path)), 20)


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
    holds a short command's output and sends it with the exit code. A loaded machine may take
    longer than the hold (0.2 s) to run the command, so one of a few tries must come in one write;
    without the hold none does (the sleep splits the output)."""
    whole = b"o\0\0\0\x01a" + b"e\0\0\0\x01b" + b"x\0\0\0\x013"
    firsts = []
    for _ in range(5):
        s = _raw(agent, b"\n" + json.dumps({"cmd": "printf a; sleep 0.05; printf b >&2; exit 3",
                                            "stdin": None}).encode() + b"\n")
        firsts.append(s.recv(1 << 16))  # waits for the first write the agent makes
        s.close()
        if firsts[-1] == whole:
            break
    assert firsts[-1] == whole, firsts


def test_a_long_commands_output_is_not_held_until_it_ends(agent: str, tmp_path: Path) -> None:
    """What a command prints goes to the sink within the hold (0.2 s), not at its end: the command
    waits up to 2.5 s for the sink to have its first line before it ends."""
    done, seen = tmp_path / "done", tmp_path / "seen"
    early: list[bool] = []

    class Sink:
        def write(self, data: bytes) -> None:
            early.append(not done.exists())
            seen.touch()

    wait = f"i=0; while [ ! -e {seen} ] && [ $i -lt 50 ]; do sleep 0.05; i=$((i + 1)); done"
    got = request(agent, f"echo first; {wait}; touch {done}; echo last", timeout=20, hello_within=5,
                  sink=Sink())
    assert got is not None and got[0] == 0
    assert early[0] is True and done.exists()


def test_a_live_commands_last_lines_come_out_before_its_exit_code() -> None:
    """A held command (`open_live`: doctor's lag readers, `logs -f`) prints its last lines and exits:
    when they and the exit code arrive while `exit_status` is asked, it says "not over" until `read`
    has handed them out, so a caller that stops at the exit code (`stream`) loses none. (Doctor once
    reported a reader's two last lines "not seen within 150 s".)"""
    ours, agents = socket.socketpair()
    live = AgentLive(ours)
    try:
        agents.sendall(frame(b"o", b"new 0\n"))
        assert live.read(5.0) == (b"new 0\n", b"")
        agents.sendall(frame(b"o", b"app 0\n") + frame(b"e", b"bye\n") + frame(b"x", b"0"))
        assert live.exit_status() is None  # read it first: the lines came with the exit code
        assert live.read(0.0) == (b"app 0\n", b"bye\n")
        assert live.exit_status() == 0
    finally:
        live.close()
        agents.close()


def test_an_ssh_process_is_not_over_while_stdout_read_at_its_start_waits() -> None:
    """The same for a command through the ssh client (`ProcLive`): what came with its start (kept
    in `pending` by the start wait) is handed out by `read` before its exit code is."""
    import subprocess

    from ablate.transport.sshproc import ProcLive

    proc = subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    live = ProcLive(proc)
    try:
        wait_for(lambda: not live.read(0.05)[0] and not live._sel.get_map(), 10)  # both pipes at EOF
        live.pending = b"said at its start\n"
        assert live.exit_status() is None
        assert live.read(0.0)[0] == b"said at its start\n"
        assert live.exit_status() == 0
    finally:
        live.close()
