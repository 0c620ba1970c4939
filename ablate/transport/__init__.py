"""Pick the transport for a host and for the shared FS."""

from __future__ import annotations

from ablate.config import Host, Project
from ablate.errors import AblateError
from ablate.transport.base import CommandResult, HostTransport, SharedFS
from ablate.transport.local import LocalFS, LocalHost

__all__ = ["CommandResult", "HostTransport", "SharedFS", "host_transport", "shared_fs"]


def host_transport(project: Project, host: Host) -> HostTransport:
    if host.transport == "local":
        return LocalHost(host.name)
    raise AblateError(
        f"host {host.name}: the ssh transport is not available in this version; "
        "use `transport: local` (profile local) or upgrade ablate"
    )


def shared_fs(project: Project) -> SharedFS:
    """The shared FS as the controller reaches it (local: the directory itself)."""
    if project.profile.transport == "local":
        return LocalFS(project.sweep_root())
    raise AblateError(
        f"profile {project.profile.name}: the ssh transport is not available in this version; "
        "use profile local or upgrade ablate"
    )
