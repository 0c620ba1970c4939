"""SSHHost against the ssh configs and known_hosts files users really have, on the test bed's real
sshd, with OpenSSH itself as the oracle: SSHHost connects exactly when `ssh -F cfg -o BatchMode=yes
alias true` does, except that it never connects past a changed or @revoked host key, and says why
in words a user can act on (a hint that works when pasted)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ablate.errors import RemoteError
from ablate.transport import accept_new_host_keys, close_all
from ablate.transport.ssh import AuthFailed, HostKeyError, HostUnreachable, SSHConfigError, SSHHost
from tests.helpers.cli import Cli
from tests.helpers.sshcases import (
    host_block,
    host_key,
    keygen_hint,
    known_names,
    log_since,
    new_key,
    oracle,
    passwd_home,
    quoted,
    shell,
    ssh_agent,
    ssh_dir,
    ssh_dir_file,
)
from tests.helpers.testbed_projects import ssh_project
from tests.testbed import Testbed

pytestmark = pytest.mark.usefixtures("testbed")

OpenHost = Callable[..., SSHHost]
CHANGED = "REMOTE HOST IDENTIFICATION HAS CHANGED"
VERIFY_FAILED = "Host key verification failed"
ALT_PORT = 2299


def end_masters(ctl: Path) -> None:
    """End every ControlMaster whose socket is in `ctl` (as if their instances were gone)."""
    for sock in ctl.iterdir():
        if stat.S_ISSOCK(sock.lstat().st_mode):
            subprocess.run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit",
                            "ablate-test"], capture_output=True, timeout=10)


@pytest.fixture(autouse=True)
def own_masters(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """No ssh agent unless a test starts one, and this test's ControlMaster sockets in a directory
    of its own, every master ended afterwards (or when the test calls this fixture's value): a
    master left over from an earlier connection would carry a later one past the host key check
    this file is about."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    ctl = Path(tempfile.mkdtemp(prefix="abctl-"))  # short: a socket path has ~100 bytes
    monkeypatch.setenv("ABLATE_SSH_CONTROL_DIR", str(ctl))
    monkeypatch.setenv("ABLATE_SSH_PERSIST", "0")
    try:
        yield lambda: end_masters(ctl)
    finally:
        end_masters(ctl)
        shutil.rmtree(ctl, ignore_errors=True)


@pytest.fixture
def open_host() -> Iterator[OpenHost]:
    """`open_host(cfg, alias, name=None, accept_new=False)`: an SSHHost, closed after the test."""
    made: list[SSHHost] = []

    def make(cfg: Path | None, alias: str, name: str | None = None, accept_new: bool = False) -> SSHHost:
        h = SSHHost(name or alias, alias, ssh_config=str(cfg) if cfg else None, accept_new=accept_new)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def alt_port(testbed: Testbed) -> Iterator[int]:
    """tb-h3's sshd also listens on port 2299 (known_hosts names it `[addr]:2299` there)."""
    testbed.configure_sshd("tb-h3", f"ListenAddress {testbed.address('tb-h3')}:{ALT_PORT}\n")
    try:
        yield ALT_PORT
    finally:
        testbed.configure_sshd("tb-h3")


def assert_connects(cfg: Path | None, alias: str, host: str, h: SSHHost, *options: str) -> None:
    """OpenSSH connects, and so does SSHHost, to the instance `host`."""
    r = oracle(cfg, alias, *options, command="hostname")
    assert (r.returncode, r.stdout) == (0, f"{host}\n"), r.stderr
    assert h.run(["hostname"]).stdout == f"{host}\n"


def assert_refused(cfg: Path | None, alias: str, *words: str, options: tuple[str, ...] = ()) -> str:
    """OpenSSH refuses; its stderr, holding each of `words`."""
    r = oracle(cfg, alias, *options)
    assert r.returncode == 255, (r.returncode, r.stdout, r.stderr)
    for w in words:
        assert w in r.stderr, r.stderr
    return r.stderr


def hostkey_refusal(h: SSHHost) -> str:
    with pytest.raises(HostKeyError) as e:
        h.run(["true"])
    return str(e.value)


# --------------------------------------------------------------------------- 1. known_hosts variants


def test_hashed_known_hosts_entries_match_and_new_keys_are_recorded_hashed(
        testbed: Testbed, tmp_path: Path, open_host: OpenHost) -> None:
    known = testbed.trust_current_keys(tmp_path / "known_hosts")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    lines = known.read_text().splitlines()
    assert len(lines) == 3 and all(line.startswith("|1|") for line in lines)
    assert testbed.address("tb-h1") not in known.read_text()
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known)
    assert_connects(cfg, "tb-h1", "tb-h1", open_host(cfg, "tb-h1"))

    # HashKnownHosts yes: the key accept-new records is hashed too, and OpenSSH then trusts it.
    fresh = tmp_path / "fresh_known_hosts"
    cfg2 = testbed.write_ssh_config(tmp_path / "ssh_config2", known_hosts=fresh,
                                    extra="\nHost *\n  HashKnownHosts yes\n")
    assert open_host(cfg2, "tb-h2", accept_new=True).run(["hostname"]).stdout == "tb-h2\n"
    [line] = fresh.read_text().splitlines()
    assert line.startswith("|1|") and line.split()[1:3] == host_key(testbed, "tb-h2").split()
    assert known_names(fresh, testbed.address("tb-h2"))
    assert oracle(cfg2, "tb-h2").returncode == 0  # StrictHostKeyChecking yes


def test_bracketed_entry_for_a_non_22_port(testbed: Testbed, tmp_path: Path, alt_port: int,
                                           open_host: OpenHost) -> None:
    """Port 2299 is looked up as `[addr]:2299`; when that is missing and there is no HostKeyAlias,
    OpenSSH also accepts a matching entry for the plain address, but a mismatching one there
    makes the key unknown, not changed."""
    addr, key = testbed.address("tb-h3"), host_key(testbed, "tb-h3")
    stale = new_key(tmp_path / "stale")

    def config(name: str, known_hosts: str) -> Path:
        (tmp_path / f"{name}.known").write_text(known_hosts)
        cfg = tmp_path / f"{name}.ssh_config"  # one per case: no connection carries over
        cfg.write_text(host_block("alt", addr, key=testbed.client_key, known=tmp_path / f"{name}.known",
                                  lines=[f"Port {alt_port}"]))
        return cfg

    cfg = config("bracketed", f"{addr} {stale}\n[{addr}]:{alt_port} {key}\n")
    assert_connects(cfg, "alt", "tb-h3", open_host(cfg, "alt"))
    cfg = config("plain", f"{addr} {key}\n")
    assert_connects(cfg, "alt", "tb-h3", open_host(cfg, "alt"))
    cfg = config("stale", f"{addr} {stale}\n")
    err = assert_refused(cfg, "alt", f"host key is known for [{addr}]:{alt_port}", VERIFY_FAILED)
    assert CHANGED not in err
    msg = hostkey_refusal(open_host(cfg, "alt"))
    assert "unknown host key" in msg and addr in msg and "CHANGED" not in msg, msg


def test_changed_key_on_a_non_22_port_names_the_bracketed_entry(
        testbed: Testbed, tmp_path: Path, alt_port: int, open_host: OpenHost) -> None:
    addr = testbed.address("tb-h3")
    known = tmp_path / "known_hosts"
    stale = new_key(tmp_path / "stale")
    known.write_text(f"{addr} {host_key(testbed, 'tb-h3')}\n[{addr}]:{alt_port} {stale}\n")
    before = known.read_text()
    cfg = tmp_path / "ssh_config"
    cfg.write_text(host_block("alt", addr, key=testbed.client_key, known=known,
                              lines=[f"Port {alt_port}"]))
    assert_refused(cfg, "alt", CHANGED)
    for accept_new in (False, True):
        msg = hostkey_refusal(open_host(cfg, "alt", accept_new=accept_new))
        assert "CHANGED" in msg, msg
    assert known.read_text() == before
    hint = keygen_hint(msg)
    assert shlex.split(hint) == ["ssh-keygen", "-f", str(known), "-R", f"[{addr}]:{alt_port}"], msg
    r = shell(hint)
    assert r.returncode == 0, r.stderr
    assert known_names(known, f"[{addr}]:{alt_port}") == []
    assert known_names(known, addr) == [f"{addr} {host_key(testbed, 'tb-h3')}"]  # port 22's stays


def test_two_user_known_hosts_files(testbed: Testbed, tmp_path: Path, open_host: OpenHost) -> None:
    first = testbed.trust_current_keys(tmp_path / "first", hosts=["tb-h2"])
    second = testbed.trust_current_keys(tmp_path / "second", hosts=["tb-h1"])
    files = f"{first} {second}"
    cfg = tmp_path / "ssh_config"
    cfg.write_text("".join(host_block(h, testbed.address(h), key=testbed.client_key, known=files)
                           for h in testbed.hosts))
    assert_connects(cfg, "tb-h1", "tb-h1", open_host(cfg, "tb-h1"))  # its key is in the second
    assert_connects(cfg, "tb-h2", "tb-h2", open_host(cfg, "tb-h2"))

    # accept-new records in the first file, as OpenSSH does; the second is left alone.
    second_before = second.read_text()
    assert_refused(cfg, "tb-h3", VERIFY_FAILED)
    assert open_host(cfg, "tb-h3", accept_new=True).run(["hostname"]).stdout == "tb-h3\n"
    assert known_names(first, testbed.address("tb-h3")) == [
        f"{testbed.address('tb-h3')} {host_key(testbed, 'tb-h3')}"]
    assert second.read_text() == second_before
    assert oracle(cfg, "tb-h3").returncode == 0  # StrictHostKeyChecking yes


def test_global_known_hosts_file(testbed: Testbed, tmp_path: Path, open_host: OpenHost) -> None:
    global_known = testbed.trust_current_keys(tmp_path / "ssh_known_hosts", hosts=["tb-h1"])
    user_known = tmp_path / "empty_known_hosts"
    user_known.write_text("")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(host_block("g-h1", testbed.address("tb-h1"), key=testbed.client_key,
                              known=user_known, lines=[f"GlobalKnownHostsFile {global_known}"]))
    assert_connects(cfg, "g-h1", "tb-h1", open_host(cfg, "g-h1"))
    assert user_known.read_text() == ""


def test_stale_plain_entries_are_ignored_under_host_key_alias(
        testbed: Testbed, tmp_path: Path, alt_port: int, open_host: OpenHost) -> None:
    """With HostKeyAlias, OpenSSH looks the key up under the alias only: stale entries under the
    address, with or without the port, are not a changed key."""
    addr, alias = testbed.address("tb-h3"), f"tbkey-{testbed.rid}-h3"
    stale = new_key(tmp_path / "stale")
    known = tmp_path / "known_hosts"
    known.write_text(f"[{addr}]:{alt_port} {stale}\n{addr} {stale}\n{alias} {host_key(testbed, 'tb-h3')}\n")
    before = known.read_text()
    cfg = tmp_path / "ssh_config"
    cfg.write_text(host_block("hka", addr, key=testbed.client_key, known=known,
                              lines=[f"Port {alt_port}", f"HostKeyAlias {alias}"]))
    assert_connects(cfg, "hka", "tb-h3", open_host(cfg, "hka"))
    assert known.read_text() == before


# --------------------------------------------------------------------------- 2. Include


def include_reaches(tb: Testbed, cfg: Path, open_host: OpenHost, include: str) -> None:
    """`Include <include>` is the whole config; the alias is defined only in the included file.

    Where is `~`? OpenSSH takes `~/.ssh/config` and `~/.ssh/known_hosts` from the passwd entry,
    but expands Include with glob(GLOB_TILDE), which reads $HOME (OpenSSH 9.2; the tests point
    $HOME elsewhere). A relative Include is `~/.ssh/<name>`. Rather than guess, put a file under
    both homes, each defining the alias for a different instance: SSHHost must reach the
    instance `ssh` reaches."""
    name = include.rsplit("/", 1)[-1]
    alias = f"inc-{uuid.uuid4().hex[:8]}"
    cfg.write_text(f"Include {include}\n")
    assert not (cfg.parent / name).exists()  # nothing beside the config: not what is read
    homes = {"tb-h1": passwd_home(), "tb-h2": Path(os.environ["HOME"])}
    assert homes["tb-h1"] != homes["tb-h2"]
    with contextlib.ExitStack() as stack:
        for host, home in homes.items():
            stack.enter_context(ssh_dir_file(home, name, host_block(
                alias, tb.address(host), key=tb.client_key, known=tb.known_hosts)))
        r = oracle(cfg, alias, command="hostname")
        assert r.returncode == 0 and r.stdout.strip() in homes, (r.stdout, r.stderr)
        assert open_host(cfg, alias).run(["hostname"]).stdout == r.stdout


def test_include_with_a_relative_path(testbed: Testbed, tmp_path: Path, open_host: OpenHost) -> None:
    name = f"ablate-test-include-{uuid.uuid4().hex[:8]}.conf"
    include_reaches(testbed, tmp_path / "ssh_config", open_host, name)


def test_include_with_a_tilde_path(testbed: Testbed, tmp_path: Path, open_host: OpenHost) -> None:
    name = f"ablate-test-include-{uuid.uuid4().hex[:8]}.conf"
    include_reaches(testbed, tmp_path / "ssh_config", open_host, f"~/.ssh/{name}")


# --------------------------------------------------------------------------- 3. HostKeyAlias + changed key


def test_changed_key_under_host_key_alias_is_refused_and_the_hint_removes_it(
        testbed: Testbed, tmp_path: Path, open_host: OpenHost, own_masters: Callable[[], None]) -> None:
    addr, alias = testbed.address("tb-h2"), f"tbkey-{testbed.rid}-h2"
    known = tmp_path / "known_hosts"
    known.write_text(f"{alias} {host_key(testbed, 'tb-h2')}\n")
    cfg, cfg_no = tmp_path / "ssh_config", tmp_path / "ssh_config_no"
    cfg.write_text(host_block("kh2", addr, key=testbed.client_key, known=known,
                              lines=[f"HostKeyAlias {alias}"]))
    cfg_no.write_text(host_block("kh2", addr, key=testbed.client_key, known=known, strict="no",
                                 lines=[f"HostKeyAlias {alias}"]))
    first = open_host(cfg, "kh2")
    assert_connects(cfg, "kh2", "tb-h2", first)
    first.close()
    own_masters()  # the instance is re-created: no connection to the old one lives on

    testbed.change_host_key("tb-h2")
    before = known.read_text()
    assert_refused(cfg, "kh2", CHANGED, VERIFY_FAILED)
    assert_refused(cfg, "kh2", CHANGED, options=("StrictHostKeyChecking=accept-new",))
    # StrictHostKeyChecking no: OpenSSH warns and goes on (publickey still allowed); SSHHost does not.
    r = oracle(cfg_no, "kh2", command="hostname")
    assert (r.returncode, r.stdout) == (0, "tb-h2\n") and CHANGED in r.stderr, r.stderr
    for c, accept_new in ((cfg, False), (cfg, True), (cfg_no, False)):
        msg = hostkey_refusal(open_host(c, "kh2", accept_new=accept_new))
        assert "CHANGED" in msg, (c, accept_new, msg)
        hint = keygen_hint(msg)
        assert shlex.split(hint) == ["ssh-keygen", "-f", str(known), "-R", alias], msg
    assert known.read_text() == before

    r = shell(hint)  # pasted as the message shows it
    assert r.returncode == 0, r.stderr
    assert known_names(known, alias) == []
    # Now unknown; accepting it records the new key under the alias, not the address.
    assert open_host(cfg, "kh2", name="kh2-new", accept_new=True).run(["hostname"]).stdout == "tb-h2\n"
    assert known_names(known, alias) == [f"{alias} {host_key(testbed, 'tb-h2')}"]
    assert known_names(known, addr) == []
    assert oracle(cfg, "kh2").returncode == 0  # StrictHostKeyChecking yes


# --------------------------------------------------------------------------- 4. certificates


def test_cert_authority_lines_for_other_domains_do_not_disturb_other_hosts(
        testbed: Testbed, tmp_path: Path, open_host: OpenHost) -> None:
    ca = new_key(tmp_path / "ca")
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority *.corp.example.org {ca}\n"
                     + testbed.trust_current_keys(tmp_path / "plain").read_text()
                     + f"@cert-authority 10.99.*,build-?.example.com {ca}\n")
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known)
    for h in ("tb-h1", "tb-h3"):
        assert_connects(cfg, h, h, open_host(cfg, h))


def test_host_certificate_signed_by_a_trusted_ca(testbed: Testbed, tmp_path: Path,
                                                 open_host: OpenHost) -> None:
    addr, hdir = testbed.address("tb-h3"), testbed.host_dir("tb-h3")
    ca = new_key(tmp_path / "ca")
    cert = hdir / "hostkey-cert.pub"
    subprocess.run(["ssh-keygen", "-q", "-s", str(tmp_path / "ca"), "-I", "tb-h3", "-h", "-n", addr,
                    str(hdir / "hostkey.pub")], check=True, capture_output=True)
    try:
        testbed.configure_sshd("tb-h3", f"HostCertificate {cert}\n")
        known = tmp_path / "known_hosts"
        known.write_text(f"@cert-authority {addr} {ca}\n")  # the CA only: no key of the host
        cfg = testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known)
        r = oracle(cfg, "tb-h3", "LogLevel=DEBUG1", command="hostname")
        assert (r.returncode, r.stdout) == (0, "tb-h3\n"), r.stderr
        assert "Server host certificate: ssh-ed25519-cert-v01@openssh.com" in r.stderr, r.stderr
        assert open_host(cfg, "tb-h3").run(["hostname"]).stdout == "tb-h3\n"
        assert known.read_text() == f"@cert-authority {addr} {ca}\n"
    finally:
        testbed.configure_sshd("tb-h3")
        cert.unlink(missing_ok=True)


# --------------------------------------------------------------------------- 5. @revoked


def test_revoked_key_is_refused_even_with_accept_new(testbed: Testbed, tmp_path: Path,
                                                     open_host: OpenHost) -> None:
    addr, key = testbed.address("tb-h1"), host_key(testbed, "tb-h1")
    known = tmp_path / "known_hosts"
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known)
    # Revoked for every name, while also listed as trusted; then revoked and otherwise unknown.
    for text in (f"{addr} {key}\n@revoked * {key}\n", f"@revoked {addr} {key}\n"):
        known.write_text(text)
        assert_refused(cfg, "tb-h1", "REVOKED HOST KEY",
                       options=("StrictHostKeyChecking=accept-new",))
        assert known.read_text() == text
        for accept_new in (False, True):
            msg = hostkey_refusal(open_host(cfg, "tb-h1", name=f"h1-{accept_new}-{len(text)}",
                                            accept_new=accept_new))
            assert "revoked" in msg.lower(), msg
        assert known.read_text() == text


# --------------------------------------------------------------------------- 6, 7. identities


def test_missing_identity_file_from_host_star_is_skipped(testbed: Testbed, tmp_path: Path,
                                                         open_host: OpenHost) -> None:
    missing = tmp_path / "no-such-key"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  IdentityFile {missing}\n"
                   + host_block("id-h1", testbed.address("tb-h1"), key=testbed.client_key,
                                known=testbed.known_hosts))
    assert_connects(cfg, "id-h1", "tb-h1", open_host(cfg, "id-h1"))
    assert not missing.exists()


def test_agent_only_key_selected_by_its_public_half(testbed: Testbed, tmp_path: Path,
                                                    open_host: OpenHost,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The 1Password / Secretive pattern: `IdentityFile <the .pub>` + IdentitiesOnly, the private
    key only in the agent."""
    pub = tmp_path / "agent_id.pub"
    shutil.copyfile(f"{testbed.client_key}.pub", pub)
    cfg = tmp_path / "ssh_config"
    cfg.write_text(host_block("ag-h1", testbed.address("tb-h1"), key=pub, known=testbed.known_hosts))
    # Without the agent the public half cannot sign: OpenSSH and SSHHost both fail to authenticate.
    assert_refused(cfg, "ag-h1", "Permission denied")
    with pytest.raises(AuthFailed):
        open_host(cfg, "ag-h1", name="no-agent").run(["true"])
    with ssh_agent() as sock:
        r = subprocess.run(["ssh-add", "-q", str(testbed.client_key)], capture_output=True, text=True,
                           env={**os.environ, "SSH_AUTH_SOCK": sock}, timeout=30)
        assert r.returncode == 0, r.stderr
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        assert_connects(cfg, "ag-h1", "tb-h1", open_host(cfg, "ag-h1"))


# --------------------------------------------------------------------------- 8. proxies


def test_proxy_command_through_another_host(testbed: Testbed, tmp_path: Path,
                                            open_host: OpenHost) -> None:
    cfg = tmp_path / "ssh_config"
    testbed.write_ssh_config(cfg, extra=host_block(
        "pc-h2", testbed.address("tb-h2"), key=testbed.client_key, known=testbed.known_hosts,
        lines=[f"ProxyCommand ssh -F {cfg} -W %h:%p tb-h1"]))
    log = testbed.host_dir("tb-h2") / "sshd.log"
    offset = log.stat().st_size
    assert_connects(cfg, "pc-h2", "tb-h2", open_host(cfg, "pc-h2"))
    accepted = [line for line in log_since(log, offset).splitlines() if "Accepted publickey" in line]
    assert len(accepted) >= 2, accepted  # ssh's and SSHHost's
    assert all(f"from {testbed.address('tb-h1')} " in line for line in accepted), accepted


def test_two_hop_proxy_jump_chain(testbed: Testbed, tmp_path: Path, open_host: OpenHost) -> None:
    k, known = testbed.client_key, testbed.known_hosts
    a2, a3 = testbed.address("tb-h2"), testbed.address("tb-h3")
    extra = (host_block("hop-h2", a2, key=k, known=known, lines=["ProxyJump tb-h1"])      # hop 1
             + host_block("chain-h3", a3, key=k, known=known, lines=["ProxyJump hop-h2"])  # hop 2
             + host_block("list-h3", a3, key=k, known=known, lines=["ProxyJump tb-h1,tb-h2"]))
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", extra=extra)
    logs = {h: testbed.host_dir(h) / "sshd.log" for h in ("tb-h2", "tb-h3")}
    offsets = {h: p.stat().st_size for h, p in logs.items()}
    for alias in ("chain-h3", "list-h3"):
        assert_connects(cfg, alias, "tb-h3", open_host(cfg, alias))

    def accepted_from(h: str) -> set[str]:
        return {line.split(" from ")[1].split()[0] for line in log_since(logs[h], offsets[h]).splitlines()
                if "Accepted publickey" in line}

    # tb-h3 was reached from tb-h2 only, and tb-h2 from tb-h1 only: two hops, four times.
    assert accepted_from("tb-h3") == {testbed.address("tb-h2")}
    assert accepted_from("tb-h2") == {testbed.address("tb-h1")}


# --------------------------------------------------------------------------- 9. Match


def test_match_block_defines_the_alias(testbed: Testbed, tmp_path: Path, open_host: OpenHost) -> None:
    alias = f"m-{uuid.uuid4().hex[:6]}"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  IdentityFile {testbed.client_key}\n  IdentitiesOnly yes\n"
                   f"  UserKnownHostsFile {testbed.known_hosts}\n  StrictHostKeyChecking yes\n\n"
                   f"Match host {alias}\n  HostName {testbed.address('tb-h2')}\n  User root\n")
    assert_connects(cfg, alias, "tb-h2", open_host(cfg, alias))


# --------------------------------------------------------------------------- 10. unknown key


def test_unknown_key_is_refused_with_a_hint_naming_the_config(
        testbed: Testbed, tmp_path: Path, open_host: OpenHost) -> None:
    known = testbed.trust_current_keys(tmp_path / "known_hosts", hosts=["tb-h2"])
    before = known.read_text()
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known, strict="ask")
    assert_refused(cfg, "tb-h1", VERIFY_FAILED)
    msg = hostkey_refusal(open_host(cfg, "tb-h1", name="node1"))
    assert "unknown host key" in msg and testbed.address("tb-h1") in msg, msg
    assert f"ssh -F {quoted(cfg)} tb-h1" in msg and "--accept-new-host-keys" in msg, msg
    assert known.read_text() == before


def test_unknown_key_without_a_config_hints_plain_ssh(testbed: Testbed, open_host: OpenHost) -> None:
    """No ssh_config: OpenSSH's own defaults (~/.ssh/config, ~/.ssh/known_hosts of the passwd home),
    which have never seen this run's host keys."""
    addr = testbed.address("tb-h1")
    with ssh_dir(passwd_home()) as dot_ssh:
        known = dot_ssh / "known_hosts"
        before = known.read_bytes() if known.exists() else None
        assert_refused(None, addr, VERIFY_FAILED)
        msg = hostkey_refusal(open_host(None, addr, name="node1"))
        assert "unknown host key" in msg and f"ssh {addr}" in msg and "-F" not in msg, msg
        assert "--accept-new-host-keys" in msg, msg
        assert (known.read_bytes() if known.exists() else None) == before


# --------------------------------------------------------------------------- 11. config and auth errors


def test_bad_config_option_is_an_ssh_config_error(testbed: Testbed, tmp_path: Path,
                                                  open_host: OpenHost) -> None:
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", extra="\nHost *\n  Foo bar\n")
    assert_refused(cfg, "tb-h1", "Bad configuration option: foo")
    with pytest.raises(SSHConfigError) as e:
        open_host(cfg, "tb-h1").run(["true"])
    msg = str(e.value)
    assert "ssh config" in msg and "foo" in msg.lower(), msg
    assert not isinstance(e.value, HostUnreachable) and "cannot connect" not in msg, msg


def test_refused_key_is_auth_failed_not_unreachable(testbed: Testbed, tmp_path: Path,
                                                    open_host: OpenHost) -> None:
    stranger = tmp_path / "stranger"  # a key the hosts' authorized_keys does not hold
    assert new_key(stranger) not in (testbed.dir / "authorized_keys").read_text()
    cfg = tmp_path / "ssh_config"
    cfg.write_text(host_block("auth-h1", testbed.address("tb-h1"), key=stranger, known=testbed.known_hosts))
    assert_refused(cfg, "auth-h1", "Permission denied (publickey)")
    with pytest.raises(AuthFailed) as e:
        open_host(cfg, "auth-h1").run(["true"])
    msg = str(e.value)
    assert isinstance(e.value, RemoteError) and "authentication failed" in msg, msg
    assert not isinstance(e.value, HostUnreachable) and "cannot connect" not in msg, msg


# --------------------------------------------------------------------------- 12. CLI


def test_cli_accept_new_host_keys_after_the_subcommand(testbed: Testbed, tmp_path: Path,
                                                       cli: Cli) -> None:
    proj = ssh_project(testbed, tmp_path, f"akeys{testbed.rid}")
    known = testbed.trust_current_keys(tmp_path / "known_hosts", hosts=["tb-h2", "tb-h3"])
    testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known,
                             extra="\nHost *\n  ConnectTimeout 2\n")  # the project's ssh_config
    addr = testbed.address("tb-h1")
    try:
        r = cli(proj, "doctor", "--host", "tb-h1", "--json")
        assert r.code == 1, r
        [reach] = [c for c in r.json()["hosts"]["tb-h1"]["checks"] if c["check"] == "reachable"]
        assert not reach["ok"] and "unknown host key" in reach["reason"], reach
        assert known_names(known, addr) == []

        r = cli(proj, "doctor", "--accept-new-host-keys", "--host", "tb-h1", "--json")
        assert r.code in (0, 1), r  # accepted: not a usage error
        [reach] = [c for c in r.json()["hosts"]["tb-h1"]["checks"] if c["check"] == "reachable"]
        assert reach["ok"], reach
        assert known_names(known, addr) == [f"{addr} {host_key(testbed, 'tb-h1')}"]
        assert oracle(tmp_path / "ssh_config", "tb-h1").returncode == 0
    finally:
        accept_new_host_keys(False)
        close_all()
