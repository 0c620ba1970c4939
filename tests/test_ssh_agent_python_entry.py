"""A request's Python entry (`py`) run by the host agent in a forked child of its own, with stdin,
output and exit code, ended past its timeout with its process group; an entry it cannot run
goes the usual way (the command); a probe answers the same either way, and the probe library is
placed alike by the agent, its command and the shell script; over ssh on the test bed, a probe
runs inside the host's agent once one answers."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ablate.errors import FSError
from ablate.transport.agentlink import request
from ablate.transport.shellhost import Live, ShellHost
from ablate.transport.ssh import SSHHost
from ablate.transport.sshfs import SSHFS, probe_command, probe_lib
from tests.helpers.ssh_agent import agent_fixture, fresh_fixture, no_agents_fixture
from tests.helpers.ssh_agent import is_zombie as _zombie
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

agent = agent_fixture()
fresh = fresh_fixture()
no_agents = no_agents_fixture()


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
    got = request(agent, "exit 42", timeout=2, hello_within=5, py=_py(_lib(tmp_path), entry))
    assert got is not None and got[0] == 124
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10))  # type: ignore[arg-type]
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10)


@pytest.mark.alone  # it times a silent agent's seconds-long window, which another worker's load stretches
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
