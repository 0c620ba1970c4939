"""Pick the transport for a host and for the shared FS.

ssh: one host object per (ssh config, alias, accept_new) for the life of the process, so a command
opens one connection per host and reuses it; `close_all()` lets them go (also at exit). The client
is OpenSSH's own (`ssh.SSHHost`, which reads the user's config exactly), or the paramiko fallback
(`paramiko_ssh.ParamikoHost`) where no `ssh` binary is on PATH or `ABLATE_SSH=paramiko` asks for
it. The shared FS is reached through the first host in ablate.yaml whose profile is the default profile, and
through the next such host when that one cannot be reached; a sweep kept in an object store
(`storage:`) is reached from here (`storefs.StoreFS`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterable

from ablate.config.project import Host, Project
from ablate.errors import AblateError
from ablate.transport.base import CommandResult, HostTransport, SharedFS
from ablate.transport.fanout import fan_out
from ablate.transport.shellhost import ShellHost
from ablate.transport.ssh import SSHHost
from ablate.transport.sshfs import SSHFS
from ablate.transport.sshproc import which

__all__ = ["CommandResult", "HostTransport", "SharedFS", "accept_new_host_keys", "close_all",
           "connect_ahead", "fan_out", "host_transport", "resolve_ahead", "shared_fs"]

_SSH_HOSTS: dict[tuple[str | None, str, str, bool], ShellHost] = {}
_SSH_LOCK = threading.Lock()
_ACCEPT_NEW = False


def accept_new_host_keys(on: bool) -> None:
    """Process-wide policy set once by the CLI (`--accept-new-host-keys`): an unknown host key is
    recorded like OpenSSH's accept-new; a changed key is refused whatever this says."""
    global _ACCEPT_NEW
    _ACCEPT_NEW = on


def _ssh_config_path(project: Project) -> str | None:
    if not project.ssh_config:
        return None
    path = os.path.expanduser(project.ssh_config)
    return path if os.path.isabs(path) else str(project.dir / path)


def ssh_client() -> str:
    """Which SSH client the ssh transport uses: "openssh" or "paramiko" (see the module doc)."""
    want = os.environ.get("ABLATE_SSH", "").strip().lower()
    if want not in ("", "openssh", "paramiko"):
        raise AblateError(f"ABLATE_SSH={want!r}: give openssh or paramiko (or leave it unset)")
    if want == "paramiko" or (not want and which("ssh") is None):
        return "paramiko"
    if which("ssh") is None:
        raise AblateError("ABLATE_SSH=openssh, but no `ssh` client is on PATH: install OpenSSH's "
                          "client, or unset ABLATE_SSH to use the paramiko fallback")
    return "openssh"


def _ssh_host(project: Project, host: Host, accept_new: bool) -> ShellHost:
    key = (_ssh_config_path(project), host.name, host.ssh, accept_new)
    with _SSH_LOCK:
        if key not in _SSH_HOSTS:
            if ssh_client() == "paramiko":
                from ablate.transport.paramiko_ssh import ParamikoHost

                _SSH_HOSTS[key] = ParamikoHost(host.name, host.ssh, ssh_config=key[0],
                                               accept_new=accept_new)
            else:
                _SSH_HOSTS[key] = SSHHost(host.name, host.ssh, ssh_config=key[0], accept_new=accept_new,
                                          python=host.profile.python)
        return _SSH_HOSTS[key]


def resolve_ahead(project: Project) -> None:
    """Start every ssh host's `ssh -G` now, in the background, so that it runs while the caller
    imports and reads what it needs; the first use waits for it (`SSHHost.options` holds a lock
    while it runs) and, should it have failed, runs it again and raises."""
    for h in project.hosts.values():
        if h.transport != "ssh":
            continue
        try:
            host = _ssh_host(project, h, _ACCEPT_NEW)
        except AblateError:
            continue  # said where the host is used, as without this
        if isinstance(host, SSHHost) and not host.options_kept():  # else a thread of its own
            threading.Thread(target=_quietly, args=(host.options,), daemon=True).start()


def connect_ahead(project: Project, names: Iterable[str]) -> None:
    """Start connecting to these ssh hosts now, in the background (`SSHHost.warm`), so that they
    connect while the command takes its lock and reads the shared FS through another host: at first
    contact the lock's host alone is a connection and a login shell before the others start. The
    first use of a host waits for what is under way (one master, one login shell, as without this)
    and reports its failure itself."""
    for name in sorted(set(names)):
        h = project.hosts.get(name)
        if h is None or h.transport != "ssh":
            continue
        try:
            host = _ssh_host(project, h, _ACCEPT_NEW)
        except AblateError:
            continue
        if isinstance(host, SSHHost):
            host.warm_ahead()


def _quietly(fn: Callable[[], object]) -> None:
    with contextlib.suppress(AblateError):
        fn()


def close_all() -> None:
    """Let go of every SSH connection this process used (the end of a command; OpenSSH's
    ControlMaster sockets stay for the next command, see `ssh.py`)."""
    with _SSH_LOCK:
        hosts = list(_SSH_HOSTS.values())
        _SSH_HOSTS.clear()
    for h in hosts:
        h.close()


atexit.register(close_all)


def host_transport(project: Project, host: Host, *, accept_new: bool | None = None) -> HostTransport:
    accept = _ACCEPT_NEW if accept_new is None else accept_new
    if host.transport == "slurm":
        from ablate.remote.layout import SweepLayout, session_name
        from ablate.transport.slurm import SlurmHost

        slurm = host.profile.slurm
        assert slurm is not None  # the config's rule: transport slurm has a slurm: mapping
        return SlurmHost(host.name, _slurm_runner(project, host, accept), slurm,
                         SweepLayout(project.sweep_root(host)).slurm,
                         session_name(project.sweep, host.name, ""),
                         python=host.profile.python, env=host.profile.env)
    if host.transport == "local":
        from ablate.transport.local import LocalHost  # libtmux: only when a host is local

        return LocalHost(host.name)
    return _ssh_host(project, host, accept)


def _slurm_runner(project: Project, host: Host, accept: bool) -> HostTransport:
    """Where a Slurm host's commands run: its login node over ssh, or (no `login`) this machine."""
    slurm = host.profile.slurm
    if slurm is None or slurm.login is None:
        from ablate.transport.local import LocalHost

        return LocalHost(host.name)
    return _ssh_host(project, dataclasses.replace(host, ssh=slurm.login, transport="ssh"), accept)


def shared_fs(project: Project, *, accept_new: bool | None = None, via: str | None = None) -> SharedFS:
    """The shared FS as the controller reaches it (local: the directory itself; ssh: through the
    hosts of the default profile, in ablate.yaml order, or only through host `via` when given:
    `reconcile --fs --host H`; a profile with `storage`: the object store itself, `StoreFS`)."""
    profile = project.profile
    accept = _ACCEPT_NEW if accept_new is None else accept_new
    store = project.sweep_store()
    if store is not None:  # reached from here, not through a host: `via` has nothing to go through
        from ablate.transport.storefs import open_store_fs  # boto3: only where a store is used

        try:
            return open_store_fs(*store)
        except ImportError as e:
            raise AblateError(f"profile {profile.name} keeps the sweep in {store[0]}, which needs boto3 "
                              f"on this machine ({e}); pip install boto3") from e
    if profile.transport == "local" or (profile.slurm is not None and profile.slurm.login is None):
        from ablate.transport.local import LocalFS  # a Slurm cluster's FS, mounted here

        return LocalFS(project.sweep_root())
    if profile.slurm is not None and profile.slurm.login is not None:
        login = next((h for h in project.hosts.values() if h.profile.name == profile.name), None)
        if login is not None:  # its shared FS through the login node
            via_login = dataclasses.replace(login, ssh=profile.slurm.login, transport="ssh")
            return SSHFS([_ssh_host(project, via_login, accept)], project.sweep_root(),
                         python=profile.python, env=profile.env)
    if via is not None:
        h = project.host(via)
        if h.transport != "ssh":
            raise AblateError(f"host {via} is not an ssh host; --host names a live host that mounts the FS")
        return SSHFS([_ssh_host(project, h, accept)], project.sweep_root(h),
                     python=h.profile.python, env=h.profile.env)
    hosts = [h for h in project.hosts.values() if h.profile.name == profile.name and h.transport == "ssh"]
    if not hosts:
        raise AblateError(
            f"profile {profile.name}: no ssh host in ablate.yaml uses it, so nothing reaches its "
            f"shared FS {profile.shared_fs}; give at least one host that profile")
    return SSHFS([_ssh_host(project, h, accept) for h in hosts], project.sweep_root(),
                 python=profile.python, env=profile.env)
