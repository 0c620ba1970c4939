"""A queue runs in the environment of the connection that launched it, not in its tmux server's
(ablate/remote/host/session_env.py): a new tmux session takes its server's global environment, the
environment of whoever started the server, through whichever connection. On real tmux: the pane
sees the launching command's variables, the file that carried them is private and gone, a start
whose file is gone runs nothing. On two real sshds of this machine with their own `SetEnv`,
sharing one tmux server: a queue launched through each, in either order, sees its own."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ablate.remote.host import session_env
from ablate.transport import close_all
from ablate.transport.ssh import SSHHost
from tests.helpers.cli import Cli
from tests.helpers.sshd_pair import VAR, missing_requirement, sshd_pair
from tests.helpers.wait import wait_for

ENV_DIR = Path(f"{session_env.DIR_PREFIX}{os.getuid()}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[list[str]]:
    """A tmux server of this test's own, started from an environment with FOO=server."""
    tmux = ["tmux", "-L", f"ablate-senv-{os.getpid()}-{tmp_path.name[-20:]}"]
    subprocess.run([*tmux, "new-session", "-d", "-s", "first", "sleep 600"], check=True,
                   env={**os.environ, "FOO": "server", "ONLY_SERVER": "1"})
    yield tmux
    subprocess.run([*tmux, "kill-server"], capture_output=True, check=False)


def _start(tmux: list[str], session: str, argv: list[str], env: dict[str, str],
           name: str | None = None) -> subprocess.CompletedProcess[str]:
    name = name or session_env.new_name(session)
    command = session_env.session_command(name, argv)
    return subprocess.run(session_env.captured(name, [*tmux, "new-session", "-d", "-s", session, command]),
                          env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.tmux
def test_a_pane_gets_the_launching_commands_environment_not_the_servers(server: list[str],
                                                                         tmp_path: Path) -> None:
    out = tmp_path / "env.out"
    env = {"PATH": os.environ["PATH"], "FOO": "client", "MULTI": "a b\nc=d"}
    r = _start(server, "q1", ["sh", "-c", f"env -0 >{out}.tmp && mv {out}.tmp {out}"], env)
    assert r.returncode == 0, r
    wait_for(out.exists, timeout=20)
    seen = dict(kv.split("=", 1) for kv in out.read_text().split("\0") if kv)
    assert seen["FOO"] == "client" and seen["MULTI"] == "a b\nc=d" and "ONLY_SERVER" not in seen, seen
    assert seen["TMUX"].startswith("/") and seen["TMUX_PANE"].startswith("%") and seen["TERM"], seen
    assert not list(ENV_DIR.glob("q1.*")), "the file is removed once read"
    assert stat.S_IMODE(ENV_DIR.stat().st_mode) == 0o700 and ENV_DIR.stat().st_uid == os.getuid()


@pytest.mark.tmux
def test_the_file_is_private_and_a_failed_start_leaves_none(server: list[str]) -> None:
    name = session_env.new_name("first")
    # the session exists already: tmux refuses, the command fails, its file goes
    r = _start(server, "first", ["true"], dict(os.environ), name)
    assert r.returncode != 0 and "duplicate session" in r.stdout + r.stderr, r
    assert not (ENV_DIR / name).exists()
    # while a pane has not read it yet, only its owner may
    name = session_env.new_name("q2")
    r = _start(server, "q2", ["true"], dict(os.environ), name)
    assert r.returncode == 0, r
    wait_for(lambda: not (ENV_DIR / name).exists(), timeout=20)
    path = session_env.write_here(session_env.new_name("q3"), {b"A": b"1"})
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with pytest.raises(FileExistsError):  # a name is written once
            session_env.write_here(Path(path).name, {b"A": b"2"})
    finally:
        os.unlink(path)


@pytest.mark.tmux
def test_a_start_whose_file_is_gone_runs_nothing_and_says_so(server: list[str], tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    log = tmp_path / "pane.log"
    command = session_env.session_command(session_env.new_name("q4"), ["touch", str(ran)])
    r = subprocess.run([*server, "new-session", "-d", "-s", "q4", f"{command} 2>{log}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r
    wait_for(lambda: log.exists() and "gone" in log.read_text(), timeout=20)
    assert "environment file" in log.read_text() and "launch this queue again" in log.read_text()
    assert not ran.exists()


# --------------------------------------------------------------------------- through two sshds


def _project(tmp: Path, cfg: Path, sweep: str) -> Path:
    """Two hosts, `sa` and `sb`: the same machine through two sshds; one queue of one cell each.
    The cell writes what it sees of VAR, then waits for `go` (its queue's tmux session stays)."""
    proj = tmp / "proj"
    (proj / "profiles").mkdir(parents=True)
    (proj / "profiles" / "pair.yaml").write_text(yaml.safe_dump({
        "transport": "ssh", "shared_fs": str(tmp / "shared"), "ckpt_root": str(tmp / "ckpt"),
        "python": sys.executable}))
    (proj / "seen.sh").write_text(
        'n=${1##*/}; n=${n%.yaml}\n'
        f'printf %s "${VAR}" >"{proj}/seen-$n.tmp" && mv "{proj}/seen-$n.tmp" "{proj}/seen-$n"\n'
        f'while [ ! -e "{proj}/go" ]; do sleep 0.1; done\n'
        'printf x >"$2/m.bin"\n')
    (proj / "configs").mkdir()
    (proj / "queues").mkdir()
    for host in ("sa", "sb"):
        (proj / "configs" / f"c{host}.yaml").write_text(f"host: {host}\n")
        (proj / "queues" / f"q{host}.txt").write_text(f"# ablate: host={host}\nconfigs/c{host}.yaml t\n")
    (proj / "ablate.yaml").write_text(yaml.safe_dump({
        "profile": "pair", "sweep": sweep, "workdir": str(proj), "train": "bash seen.sh {cfg} {ckpt_dir}",
        "artifacts": {"checkpoint": "m.bin"}, "tasks": {"t": {"epochs": 1}},
        "budget": {"ckpt_size": "1MB", "scratch": "1MB"}, "heartbeat_secs": 1,
        "ssh_config": str(cfg), "hosts": {"sa": {}, "sb": {}}}, sort_keys=False))
    return proj


@pytest.mark.bed
@pytest.mark.parametrize("order", [("sa", "sb"), ("sb", "sa")])
def test_a_queue_launched_through_each_sshd_sees_its_own_session(tmp_path: Path, cli: Cli,
                                                                   order: tuple[str, str]) -> None:
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    tmux_dir = tmp_path / "tmux"  # one tmux server for both sshds, none of this machine's
    tmux_dir.mkdir(mode=0o700)
    with sshd_pair(tmp_path / "sshd", setenv=f"TMUX_TMPDIR={tmux_dir}") as cfg:
        links = {n: SSHHost(n, ssh_config=str(cfg))._agent_link() for n in order}
        proj = _project(tmp_path, cfg, f"senv-{order[0]}")
        try:
            first, second = order
            r = cli(proj, "launch", f"q{first}", "--host", first)
            assert r.code == 0, r.output
            wait_for(lambda: (proj / f"seen-c{first}").exists(), timeout=60)
            # the first queue's session keeps the tmux server its launch started
            tmux = ["tmux", "-S", str(tmux_dir / "tmux-0" / "default")]
            assert subprocess.run([*tmux, "has-session"], capture_output=True).returncode == 0
            assert f"{VAR}={first}" in subprocess.run([*tmux, "show-environment", "-g", VAR],
                                                      capture_output=True, text=True).stdout
            r = cli(proj, "launch", f"q{second}", "--host", second)
            assert r.code == 0, r.output
            wait_for(lambda: (proj / f"seen-c{second}").exists(), timeout=60)
            assert {h: (proj / f"seen-c{h}").read_text() for h in order} == {h: h for h in order}
        finally:
            (proj / "go").write_text("")
            close_all()
            subprocess.run(["tmux", "-S", str(tmux_dir / "tmux-0" / "default"), "kill-server"],
                           capture_output=True, check=False)
            for link in links.values():  # the agents this test started (they would idle an hour)
                if link is not None:
                    subprocess.run(["pkill", "-f", link[1]], check=False)
