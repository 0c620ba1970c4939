"""The ssh transport against the test bed: real sshd, real tmux, one shared directory."""

from __future__ import annotations

import os
import re
import shlex
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from ablate.config.project import load_project
from ablate.errors import RemoteError
from ablate.transport import close_all, host_transport, shared_fs
from ablate.transport.fanout import fan_out
from ablate.transport.shellhost import BASH_C
from ablate.transport.ssh import HostKeyError, HostUnreachable, SSHHost
from ablate.transport.sshfs import SSHFS
from tests.helpers.wait import wait_for
from tests.testbed import Testbed


def hosts(tb: Testbed, **kw: object) -> list[SSHHost]:
    return [SSHHost(h, ssh_config=str(tb.ssh_config), **kw) for h in tb.hosts]  # type: ignore[arg-type]


def test_fan_out_runs_in_parallel_and_keeps_partial_successes(testbed: Testbed) -> None:
    hs = hosts(testbed)
    res = fan_out(hs, lambda h: h.run(["sh", "-c", "hostname; date +%s.%N; sleep 4; date +%s.%N"]).check())
    got = {h.name: r.stdout.split() for h, r in res.succeeded.items()}
    assert {name: out[0] for name, out in got.items()} == {h: h for h in ("tb-h1", "tb-h2", "tb-h3")}
    # One clock (one kernel): the three 4 s commands ran at once, not one after another (4 s: three
    # first-contact handshakes on a loaded machine start up to a second or more apart; one after
    # another, each would start after the last one's end).
    assert max(float(out[1]) for out in got.values()) < min(float(out[2]) for out in got.values())

    testbed.kill("tb-h2")
    res = fan_out(hosts(testbed), lambda h: h.run(["hostname"]).check())
    assert {h.name: r.stdout.strip() for h, r in res.succeeded.items()} == {
        "tb-h1": "tb-h1", "tb-h3": "tb-h3"}
    [(dead, err)] = res.failed.items()
    assert dead.name == "tb-h2" and isinstance(err, HostUnreachable)
    assert "tb-h2" in str(err) and testbed.address("tb-h2") in str(err)


def test_every_argument_arrives_literally(testbed: Testbed) -> None:
    h = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    args = ["$(touch /tmp/pwned); x", "two words", "'q'\"", "*", "a\nb", "", "-n"]
    r = h.run(["printf", "[%s]", *args]).check()
    assert r.stdout == "".join(f"[{a}]" for a in args)
    assert h.run(["test", "-e", "/tmp/pwned"]).rc == 1


def test_unknown_host_key_is_refused_with_how_to_trust_it(testbed: Testbed, tmp_path: Path) -> None:
    known = testbed.trust_current_keys(tmp_path / "known_hosts", hosts=["tb-h2"])
    before = known.read_text()
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known)
    with pytest.raises(HostKeyError) as e:
        SSHHost("tb-h1", ssh_config=str(cfg)).run(["true"])
    msg = str(e.value)
    assert "\n" not in msg and "unknown host key" in msg and testbed.address("tb-h1") in msg
    # the config it read, and a way to be asked although that config says StrictHostKeyChecking yes
    assert f"`ssh -F {cfg} -o StrictHostKeyChecking=ask tb-h1`" in msg
    assert "--accept-new-host-keys" in msg
    assert known.read_text() == before
    assert SSHHost("tb-h2", ssh_config=str(cfg)).run(["hostname"]).stdout == "tb-h2\n"


def test_accept_new_records_an_unknown_key_and_refuses_a_changed_one(
        testbed: Testbed, tmp_path: Path) -> None:
    known = tmp_path / "kh" / "known_hosts"  # the directory does not exist yet either
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known)
    assert SSHHost("tb-h1", ssh_config=str(cfg), accept_new=True).run(["hostname"]).stdout == "tb-h1\n"
    key = (testbed.host_dir("tb-h1") / "hostkey.pub").read_text().split()[:2]
    assert known.read_text().split() == [testbed.address("tb-h1"), *key]
    # Now trusted without the flag.
    assert SSHHost("tb-h1", ssh_config=str(cfg)).run(["true"]).rc == 0

    testbed.change_host_key("tb-h1")
    for config in (cfg, testbed.ssh_config):  # a re-created instance: its old connections are gone
        SSHHost("tb-h1", ssh_config=str(config)).disconnect()
    for accept_new, config in ((True, cfg), (False, testbed.ssh_config)):
        with pytest.raises(HostKeyError, match="CHANGED") as e:
            SSHHost("tb-h1", ssh_config=str(config), accept_new=accept_new).run(["true"])
        assert "ssh-keygen -f" in str(e.value) and "\n" not in str(e.value)
    assert known.read_text().split() == [testbed.address("tb-h1"), *key]
    # The fix it names works when pasted: the old entry goes, and the host is merely unknown.
    fix = re.search(r"remove the old key with `([^`]+)`", str(e.value))
    assert fix is not None, str(e.value)
    subprocess.run(["sh", "-c", fix.group(1)], check=True, capture_output=True)
    with pytest.raises(HostKeyError, match="unknown host key"):
        SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)).run(["true"])


def test_tmux_session_outlives_the_ssh_connection(testbed: Testbed) -> None:
    h1 = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    out = f"{testbed.local_path}/ticks"
    h1.tmux_start("ablate-q1", ["sh", "-c", f'while :; do echo "$MSG" >> {out}; sleep 0.1; done'],
                  {"MSG": "a $b 'c'"}, cwd="/")
    h1.close()  # the controller goes away

    h1 = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    h2 = SSHHost("tb-h2", ssh_config=str(testbed.ssh_config))
    assert h1.tmux_sessions() == {"ablate-q1"}
    assert h2.tmux_sessions() == set()  # its own tmux server
    ticks = testbed.local_dir("tb-h1") / "ticks"
    n = len(ticks.read_text().splitlines())
    wait_for(lambda: len(ticks.read_text().splitlines()) > n + 2, timeout=10)
    assert set(ticks.read_text().splitlines()) == {"a $b 'c'"}
    h1.tmux_kill("ablate-q1")
    assert h1.tmux_sessions() == set()
    h1.tmux_kill("ablate-q1")  # killing what is gone is fine


def test_shared_fs_operations(testbed: Testbed, tmp_path: Path) -> None:
    root = f"{testbed.shared_path}/ablate/ops"
    fs = SSHFS(SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)), root)
    backing = testbed.shared_dir / "ablate" / "ops"

    fs.write_atomic(f"{root}/DEPLOYED.json", b'{"v": 1}')
    fs.write_atomic(f"{root}/DEPLOYED.json", b'{"v": 2}\x00\xff', mode=0o640)
    assert fs.read_bytes(f"{root}/DEPLOYED.json") == b'{"v": 2}\x00\xff'
    assert stat.S_IMODE((backing / "DEPLOYED.json").stat().st_mode) == 0o640
    assert os.listdir(backing) == ["DEPLOYED.json"]  # no temp file left behind
    assert fs.read_bytes(f"{root}/missing") is None
    assert fs.exists(f"{root}/DEPLOYED.json") and not fs.exists(f"{root}/missing")
    big = os.urandom(3 << 20)  # several channel windows
    fs.write_atomic(f"{root}/ckpt.bin", big)
    assert fs.fetch(f"{root}/ckpt.bin", str(tmp_path / "ckpt.bin")) == len(big)
    assert (tmp_path / "ckpt.bin").read_bytes() == big
    (backing / "ckpt.bin").unlink()
    with pytest.raises(FileNotFoundError):
        fs.fetch(f"{root}/ckpt.bin", str(tmp_path / "gone"))

    wrapper = f"{root}/wrappers/run_one.abc.sh"
    assert fs.create_immutable(wrapper, b"#!/bin/bash\necho v1\n") is True
    assert fs.create_immutable(wrapper, b"#!/bin/bash\necho v1\n") is False
    with pytest.raises(RemoteError, match="other content"):
        fs.create_immutable(wrapper, b"#!/bin/bash\necho v2\n")
    assert (backing / "wrappers" / "run_one.abc.sh").read_bytes() == b"#!/bin/bash\necho v1\n"
    assert stat.S_IMODE((backing / "wrappers" / "run_one.abc.sh").stat().st_mode) == 0o444
    assert os.listdir(backing / "wrappers") == ["run_one.abc.sh"]

    fs.append_line(f"{root}/events/tb-h1.q1.jsonl", '{"ev": "queue_start", "host": "tb-h1"}')
    fs.append_line(f"{root}/events/tb-h1.q1.jsonl", '{"ev": "start", "idx": 0}\n')
    fs.write_atomic(f"{root}/heartbeats/tb-h1.q1", b'{"state": "running"}')
    snap = fs.probe("snapshot", {"root": root})
    assert snap["events"] == {"tb-h1.q1": [{"ev": "queue_start", "host": "tb-h1"},
                                           {"ev": "start", "idx": 0}]}
    assert snap["heartbeats"]["tb-h1.q1"]["data"] == {"state": "running"}
    assert abs(snap["now"] - time.time()) < 60
    shipped = backing / "lib" / fs.lib_dir.rsplit("/", 1)[1] / "ablate" / "remote" / "host" / "probe.py"
    assert stat.S_IMODE(shipped.stat().st_mode) == 0o444
    # Later probes are one round trip and never write the library again.
    assert fs.probe("now", {"root": root})["now"] > 0


def test_probe_that_does_not_print_one_json_document_is_an_error(testbed: Testbed) -> None:
    fs = SSHFS(SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)), f"{testbed.shared_path}/p",
               python="echo")
    fs.ship_probe()
    with pytest.raises(RemoteError, match=r"tb-h1: `echo -m ablate.remote.host.probe now .*exactly one JSON"):
        fs.probe("now", {"root": fs.root})


def test_shared_dir_is_shared_and_local_disk_is_not(testbed: Testbed) -> None:
    h1, h2 = hosts(testbed)[:2]
    root = f"{testbed.shared_path}/nonce"
    SSHFS(h1, root).write_atomic(f"{root}/n", b"nonce-1")
    assert SSHFS(h2, root).read_bytes(f"{root}/n") == b"nonce-1"
    h1.run(["sh", "-c", f"echo x > {testbed.local_path}/only-h1"]).check()
    assert h1.run(["test", "-e", f"{testbed.local_path}/only-h1"]).rc == 0
    assert h2.run(["test", "-e", f"{testbed.local_path}/only-h1"]).rc == 1


def test_a_dropped_link_times_out_within_the_timeout_while_others_answer(testbed: Testbed) -> None:
    connected = SSHHost("tb-h3", ssh_config=str(testbed.ssh_config), connect_timeout=2)
    connected.run(["true"]).check()
    testbed.link_down("tb-h2")
    testbed.link_down("tb-h3")

    t0 = time.monotonic()
    with pytest.raises(HostUnreachable, match="tb-h3: the open connection did not answer within 2s"):
        connected.run(["true"], timeout=2)  # an open connection: the command's time-out applies
    assert time.monotonic() - t0 < 5

    t0 = time.monotonic()
    res = fan_out(hosts(testbed, connect_timeout=2), lambda h: h.run(["hostname"]).check())
    assert time.monotonic() - t0 < 5
    assert [h.name for h in res.succeeded] == ["tb-h1"]
    assert {h.name for h in res.failed} == {"tb-h2", "tb-h3"}
    # a fresh connection: the 2 s connect time-out; one kept from an earlier test: its round trip
    assert all(isinstance(e, HostUnreachable) and ("2s connect time-out" in str(e) or
                                                   "no answer within 3s on the kept connection" in str(e))
               for e in res.failed.values()), res.failed


def test_a_command_that_outlives_its_timeout_returns_124(testbed: Testbed) -> None:
    h = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    t0 = time.monotonic()
    r = h.run(["sh", "-c", "echo started; sleep 30"], timeout=1)
    assert r.rc == 124 and r.stdout == "started\n" and "timed out after 1" in r.stderr
    assert time.monotonic() - t0 < 4
    assert h.run(["true"]).rc == 0  # the connection is still good


def test_proxyjump_reaches_a_host_through_another(testbed: Testbed, tmp_path: Path) -> None:
    extra = (f"\nHost via-h1\n  HostName {testbed.address('tb-h2')}\n  User root\n"
             f"  IdentityFile {testbed.client_key}\n  UserKnownHostsFile {testbed.known_hosts}\n"
             "  StrictHostKeyChecking yes\n  ProxyJump tb-h1\n")
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", extra=extra)
    assert SSHHost("h2", "via-h1", ssh_config=str(cfg)).run(["hostname"]).stdout == "tb-h2\n"
    log = (testbed.host_dir("tb-h2") / "sshd.log").read_text()
    assert f"from {testbed.address('tb-h1')}" in log  # the hop, not the controller, connected


def test_project_wiring_reuses_connections_and_fails_over(testbed: Testbed, tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "tb.yaml").write_text(yaml.safe_dump({
        "transport": "ssh", "shared_fs": testbed.shared_path, "ckpt_root": f"{testbed.local_path}/ckpt"}))
    (tmp_path / "ablate.yaml").write_text(yaml.safe_dump({
        "profile": "tb", "sweep": "wire", "workdir": "/root", "train": "python t.py {cfg}",
        "artifacts": {"checkpoint": "best.pth"}, "tasks": {"t": {"epochs": 1}},
        "ssh_config": str(testbed.ssh_config), "hosts": {h: {} for h in testbed.hosts}}))
    project = load_project(tmp_path)
    try:
        h1 = host_transport(project, project.hosts["tb-h1"])
        assert isinstance(h1, SSHHost) and host_transport(project, project.hosts["tb-h1"]) is h1
        fs = shared_fs(project)
        assert isinstance(fs, SSHFS) and fs.root == f"{testbed.shared_path}/ablate/wire"
        fs.write_atomic(f"{fs.root}/x", b"1")
        assert fs.via == "tb-h1"
        testbed.kill("tb-h1")
        h1.close()
        assert fs.read_bytes(f"{fs.root}/x") == b"1" and fs.via == "tb-h2"
    finally:
        close_all()


def test_probe_runs_a_bash_profile_env_first(testbed: Testbed, tmp_path: Path) -> None:
    """Profiles say `source …/activate` (bash); the probe must not run it under dash's `sh`."""
    act = testbed.shared_dir / "activate"
    act.write_text("export ABLATE_TEST_ENV_ACTIVE=1\n")
    root = f"{testbed.shared_path}/ablate/envprobe"
    fs = SSHFS(SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)), root,
               env=f"source {testbed.shared_path}/activate && test \"$ABLATE_TEST_ENV_ACTIVE\" = 1")
    snap = fs.probe("snapshot", {"root": root})
    assert isinstance(snap["now"], float) and snap["final"] == []


def test_the_next_command_reuses_the_connection_and_a_dead_one_is_replaced(testbed: Testbed) -> None:
    first = SSHHost("tb-h2", ssh_config=str(testbed.ssh_config), connect_timeout=2)
    assert first.run(["hostname"]).stdout == "tb-h2\n"
    master = first.master_pid()
    assert master is not None
    first.close()  # the end of one `ablate` command
    second = SSHHost("tb-h2", ssh_config=str(testbed.ssh_config), connect_timeout=2)
    assert second.run(["hostname"]).stdout == "tb-h2\n"
    assert second.master_pid() == master  # no new handshake: the kept connection answered
    second.close()

    testbed.reboot("tb-h2")  # the kept connection now leads nowhere
    third = SSHHost("tb-h2", ssh_config=str(testbed.ssh_config), connect_timeout=2)
    assert third.run(["hostname"]).stdout == "tb-h2\n"
    assert third.master_pid() not in (None, master)  # detected and replaced, never trusted
    third.close()

    testbed.link_down("tb-h2")  # a kept connection that went silent
    t0 = time.monotonic()
    with pytest.raises(HostUnreachable):
        SSHHost("tb-h2", ssh_config=str(testbed.ssh_config), connect_timeout=2).run(["true"])
    assert time.monotonic() - t0 < 5  # one time-out, not the round trip's plus a new connect's
    testbed.link_up("tb-h2")
    assert SSHHost("tb-h2", ssh_config=str(testbed.ssh_config), connect_timeout=2).run(
        ["hostname"]).stdout == "tb-h2\n"


def test_a_changed_ssh_config_is_a_new_connection(testbed: Testbed, tmp_path: Path) -> None:
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config")
    old = SSHHost("tb-h1", ssh_config=str(cfg))
    old.run(["true"]).check()
    pid = old.master_pid()
    cfg.write_text(cfg.read_text().replace(testbed.address("tb-h1"), testbed.address("tb-h3"), 1))
    new = SSHHost("tb-h1", ssh_config=str(cfg))
    assert new.run(["hostname"]).stdout == "tb-h3\n"  # HostName changed: the old master is not used
    assert new.master_pid() not in (None, pid)


def test_a_socket_left_by_a_killed_master_is_not_trusted(testbed: Testbed) -> None:
    first = SSHHost("tb-h3", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    pid = first.master_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # no clean exit: its socket file stays behind
    wait_for(lambda: first.master_pid() is None, timeout=10)
    h = SSHHost("tb-h3", ssh_config=str(testbed.ssh_config))
    assert h.run(["hostname"]).stdout == "tb-h3\n"  # ssh went direct, and said so only to us
    assert h.run(["hostname"]).stdout == "tb-h3\n"
    assert h.master_pid() not in (None, pid)  # the dead socket was replaced by a new master


def test_our_bash_scripts_do_not_read_the_users_bashrc_a_second_time(tmp_path: Path) -> None:
    """sshd runs the login shell with `-c <our command line>`; bash execs that line's last command
    with SHLVL lowered, and a plain `bash -c` there takes itself for the top-level shell sshd ran
    and sources ~/.bashrc again (conda or pyenv init: 0.1-0.5 s of CPU each). BASH_C's is read once,
    by the login shell. Here as sshd would run it: SSH_CLIENT set, no SHLVL yet."""
    count = tmp_path / "count"
    (tmp_path / ".bashrc").write_text(f"echo sourced >> {count}\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SSH_CLIENT": "10.0.0.1 50000 22"}

    def reads(inner: list[str]) -> int:
        count.unlink(missing_ok=True)
        subprocess.run(["bash", "-c", "printf '' >&2; " + shlex.join([*inner, "true"])], env=env,
                       stdin=subprocess.DEVNULL, check=True, timeout=30)
        return len(count.read_text().splitlines()) if count.exists() else 0

    assert reads(["bash", "-c"]) == 2  # what ablate ran before
    assert reads(list(BASH_C)) == 1
