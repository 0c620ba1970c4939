"""doctor's checks of `services:` on a host: each service's command exists (after the profile's env,
in the workdir) and each of its ports (one per queue slot: port + k) is free.

One section per service in doctor's one script per host (`ablate.run.host_measure`); a port that
answers while a queue of this sweep runs on the host is that queue's own service, not a conflict.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ablate.config.project import Host, Project
from ablate.config.services import Service
from ablate.run.host_measure import Section
from ablate.transport.shellhost import BASH_C

# $1 env, $2 workdir, $3 the command's program ("" when it cannot be told), $4... ports.
_SCRIPT = ('if [ -n "$1" ]; then eval "$1" >/dev/null 2>&1 || exit 98; fi\n'
           'cd -- "$2" 2>/dev/null || exit 95\n'
           'p=$3; shift 3\n'
           'if [ -n "$p" ] && ! command -v -- "$p" >/dev/null 2>&1; then echo "$p"; exit 97; fi\n'
           'busy=; for port in "$@"; do\n'
           '  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then busy="$busy $port"; fi\n'
           'done\n'
           '[ -z "$busy" ] || { echo "busy$busy"; exit 96; }\n')


def program(command: str) -> str:
    """The program a service command runs: its first word after `VAR=value` assignments and
    `exec`/`env`; "" when it cannot be told (a template field, a shell construct)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return ""
    for w in words:
        if w in ("exec", "env") or ("=" in w and not w.startswith(("/", "."))):
            continue
        return "" if any(c in w for c in "{}$`;|&<>()") else w
    return ""


def ports(service: Service, host: Host) -> list[int]:
    return [service.port_for(k) for k in range(len(host.slots))]


def service_sections(project: Project, host: Host) -> list[tuple[str, Sequence[str]]]:
    out: list[tuple[str, Sequence[str]]] = []
    for s in project.services:
        out.append((f"svc_{s.name}", [*BASH_C, _SCRIPT, "bash", host.profile.env or "", project.workdir,
                                      program(s.command), *map(str, ports(s, host))]))
    if project.services:
        out.append(("svc_tmux", ["tmux", "list-sessions", "-F", "#{session_name}"]))
    return out


def service_checks(project: Project, host: Host,
                   got: Mapping[str, Section]) -> list[tuple[str, bool, str]]:
    """(check, ok, reason) per service."""
    from ablate.remote.layout import session_name

    sessions = got.get("svc_tmux")
    ours = [q for q in (sessions.out.split() if sessions and sessions.rc == 0 else [])
            if any(q == session_name(project.sweep, host.name, n) for n in _queue_names(project))]
    out = []
    for i, s in enumerate(project.services):
        sec = got.get(f"svc_{s.name}")
        name, key = f"service {s.name}", f"services[{i}]"
        listed = ", ".join(map(str, ports(s, host)))
        if sec is None:
            out.append((name, False, "not checked: no answer"))
        elif sec.rc == 97:
            out.append((name, False, f"{sec.last} not found on {host.name} (after the profile's env, "
                                     f"in {project.workdir}): install it, or fix {key}.command"))
        elif sec.rc == 98:
            out.append((name, False, "the profile's env failed; see the env check"))
        elif sec.rc == 95:
            out.append((name, False, f"{project.workdir} does not exist on {host.name}"))
        elif sec.rc == 96 and ours:
            out.append((name, True, f"port(s) {sec.last.removeprefix('busy ')} answer: this sweep's queue(s) "
                                    f"{', '.join(ours)} run here with their services"))
        elif sec.rc == 96:
            out.append((name, False, f"port(s) {sec.last.removeprefix('busy ')} on {host.name} are in use: "
                                     f"stop what listens there, or move {key}.port (queue k uses port + k)"))
        elif sec.rc != 0:
            out.append((name, False, f"check failed: {sec.last or f'exit {sec.rc}'}"))
        else:
            prog = program(s.command)
            found = f"{prog} found, " if prog else ""
            out.append((name, True, f"{found}port(s) {listed} free"))
    return out


def _queue_names(project: Project) -> list[str]:
    if not project.queues_dir.is_dir():
        return []
    return sorted(p.stem for p in project.queues_dir.glob("*.txt"))
