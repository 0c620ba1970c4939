"""Ask every host, one command each and all at once: its tmux sessions and its own view of what it
wrote (`ablate.remote.host.probe.mine`: its events, heartbeats, and the claims, results and tails of the
cells they name), read through its own mount.

Why through the writer: a network FS (NFS, sshfs, FUSE mounts) caches on each client, so another
host's appended line or renamed-in result may be invisible through the FS host for seconds, while
a client's own writes are coherent for that client. `snapshot.load` merges these views over the
snapshot read through the FS host (`snapshot.merge_views`); a host that does not answer leaves its
files as the FS host sees them, and the state says how old that view may be.

A host whose profile keeps the sweep in an object store (`storage:`) mounts nothing, and the store
is strongly consistent (read-after-write, list-after-write): the snapshot read from it is already
that host's own view. Its tmux is asked as any host's, and its view is an empty document (nothing
to merge), so that the host counts as read through itself: no lag allowed for, none warned of.

The sections of the answer (`\\036ablate <kind>` lines) are shared with `ablate.monitor.hostinfo`,
whose one command per host for `status` carries the same tmux and view sections.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.remote.layout import SweepLayout
from ablate.transport import fan_out, host_transport
from ablate.transport.base import HostTransport
from ablate.transport.fanout import FanOut, gather, start_each
from ablate.transport.shellhost import BASH_C, LIST_SESSIONS, NO_TMUX_SERVER, ShellHost
from ablate.transport.sshfs import PROBE_RUN, PYC, lib_digest, probe_command

ViewAnswer = tuple[dict[str, Any] | None, str | None]  # the `mine` document, or why there is none
TmuxAnswer = tuple[set[str] | None, str | None]  # its sessions (None: not known), or why not
Answer = tuple[TmuxAnswer, ViewAnswer]  # one host's tmux and view answers

MARK = "\x1eablate"  # a record separator no log line (and no JSON document) carries
# tmux: "$@" is the host's tmux command line; its sessions come first, the rc after them.
TMUX = r"""printf '\036ablate tmux\n'
(""" + LIST_SESSIONS + r"""); printf '\036ablate tmuxrc %s\n' "$?"
"""
# The view: $vd the probe's library dir on the FS (as this host mounts it; empty: not asked), $ve
# the profile's env, $vp its python, $va the JSON arguments (with no $vd: the view itself, a store
# host's empty one). rc 97: the library is not there yet.
VIEW = r"""printf '\036ablate view\n'
if [ -z "$vd" ] && [ -n "$va" ]; then printf '%s\n\036ablate viewrc 0\n' "$va"
elif [ -z "$vd" ]; then printf '\n\036ablate viewrc 96\n'
elif [ -r "$vd/ablate/remote/host/probe.py" ]; then
  ( if [ -n "$ve" ]; then eval "$ve" >/dev/null 2>&1 || exit 98; fi
    d=$vd py=$vp f=-S; set -- mine "$va"
    """ + PYC + r"""    cd "$vd" && """ + PROBE_RUN + r"""
  ) 2>/dev/null
  printf '\n\036ablate viewrc %s\n' "$?"
else printf '\n\036ablate viewrc 97\n'; fi
"""
SCRIPT = 'vd=$1; ve=$2; vp=$3; va=$4; shift 4\n' + TMUX + VIEW
VIEW_RC = {96: "not asked (local transport)", 97: "the probe library is not on the FS as this host sees it",
           98: "the profile's env failed"}


STORE_VIEW = "{}"  # a store host's view: the store's snapshot is it already (module docstring)


def view_args(project: Project, host: str) -> list[str]:
    """$vd $ve $vp $va for `VIEW` on `host` (all empty for a local host: its FS is the controller's;
    for a host of a store, $va alone: its empty view)."""
    h = project.host(host)
    if h.transport != "ssh":
        return ["", "", "", ""]
    if h.profile.storage:
        return ["", "", "", STORE_VIEW]
    root = project.sweep_root(h)
    return [SweepLayout(root).lib_dir(lib_digest()), h.profile.env or "", h.profile.python,
            json.dumps({"root": root, "host": h.name})]


def tmux_answer(lines: Sequence[str], rc: str) -> TmuxAnswer:
    """tmux's answer as `tmux_sessions` reads it: rc 0 -> the names; no server -> none; else why."""
    text = "\n".join(lines).strip()
    if rc.strip() == "0":
        return {ln for ln in lines if ln}, None
    if NO_TMUX_SERVER.search(text):
        return set(), None
    return None, f"tmux list-sessions exited {rc.strip()}: {text[-200:]!r}"


def view_answer(lines: Sequence[str], rc: str) -> tuple[dict[str, Any] | None, str | None]:
    """The `mine` probe's document, or why there is none."""
    code = int(rc.strip()) if rc.strip().lstrip("-").isdigit() else -1
    if code != 0:
        return None, VIEW_RC.get(code, f"the view probe exited {code}")
    try:
        got = json.loads("\n".join(lines))
    except ValueError:
        return None, "the view probe did not print one JSON document"
    return (got, None) if isinstance(got, dict) else (None, "the view probe printed no JSON object")


@dataclass
class Asked:
    """Every host's answer: tmux sessions (None: not known), why a host is unreachable, and the
    views read through the hosts themselves (host -> `mine` document) or why not."""

    sessions: dict[str, set[str] | None] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    view_errors: dict[str, str] = field(default_factory=dict)


def parse(text: str) -> Answer:
    """(tmux answer, view answer) of one host's `SCRIPT` output."""
    sections: dict[str, list[str]] = {}
    rcs: dict[str, str] = {}
    current: str | None = None
    for line in text.split("\n"):
        if line.startswith(MARK + " "):
            kind, _, rest = line[len(MARK) + 1:].partition(" ")
            if kind.endswith("rc"):
                rcs[kind[:-2]] = rest
                current = None
            else:
                current = kind
                sections[kind] = []
            continue
        if current is not None:
            sections[current].append(line)
    tmux = tmux_answer(sections.get("tmux", []), rcs["tmux"]) if "tmux" in rcs else \
        (None, "tmux did not answer")
    view = view_answer(sections.get("view", []), rcs["view"]) if "view" in rcs else \
        (None, "the view was not read")
    return tmux, view


def split_view(t: HostTransport, args: Sequence[str]) -> bool:
    """Whether to ask tmux and read the view in a request of their own (`ask_split`), out of the
    host's script: when a host agent will answer, which runs the probe in its own interpreter, no
    Python started. At first contact, where this command starts the agent, a `true` starts it
    first (one login shell, as the script would be): after it, the probe goes to the agent."""
    if not args[0] or not isinstance(t, ShellHost):
        return False
    if not t.agent_ready() and t.agent_on_first():
        t.run(["true"])
    return t.agent_ready()


def ask_split(t: HostTransport, args: Sequence[str], timeout: float, live: dict[str, Any] | None = None
              ) -> tuple[TmuxAnswer | None, ViewAnswer, dict[str, Any] | None]:
    """tmux's sessions, then the view, in one `mine` probe (`view_args`, with the host's tmux
    command line): tmux answers first there, so the view holds the end of every queue tmux no
    longer lists (read before, a queue that ended in between would be a claimed cell with no end
    and no session: "interrupted", and remediated). With `live` (the probe's arguments of that
    name), also what `status` shows of the host (GPUs, log tails). The tmux answer (and the live
    one) is None when the probe could not run there (the view's answer says why)."""
    assert isinstance(t, ShellHost)
    given = {**json.loads(args[3]), "tmux": t.tmux_argv(), **({"live": live} if live is not None else {})}
    command, py = probe_command(args[0], args[1], args[2], "mine", json.dumps(given))
    try:
        rc, out, _ = t.exec(command, timeout=timeout, py=py)
    except AblateError as e:
        return None, (None, str(e).splitlines()[0]), None
    view, why = view_answer(out.decode(errors="replace").split("\n"), str(rc))
    asked = view.pop("tmux", None) if view is not None else None
    shown = view.pop("live", None) if view is not None else None
    if not isinstance(asked, dict):
        return None, (view, why), None
    tmux = tmux_answer(str(asked.get("out", "")).split("\n"), str(asked.get("rc")))
    return tmux, (view, None), shown if isinstance(shown, dict) else None


def ask_one(project: Project, host: str, timeout: float = 20.0) -> Answer:
    """(tmux answer, view answer) of one host, as `parse` gives them."""
    t = host_transport(project, project.host(host))
    args = view_args(project, host)
    view: ViewAnswer | None = None
    if split_view(t, args):
        tmux, view, _ = ask_split(t, args, timeout)
        if tmux is not None:
            return tmux, view
        args = ["", "", "", ""]  # the probe did not run there (its answer says why): tmux by the script
    out = t.run([*BASH_C, SCRIPT, "bash", *args, *t.tmux_argv()], timeout=timeout).check().stdout
    tmux, inline = parse(out)
    return tmux, view if view is not None else inline


def ask_hosts(project: Project, hosts: Sequence[str] | None = None) -> Asked:
    """Every host (or those named) in parallel: one command each (`SCRIPT`, or where a host agent
    runs it, the `mine` probe that asks tmux first: `ask_split`)."""
    names = list(project.hosts) if hosts is None else list(hosts)
    return assemble(project, fan_out(names, lambda n: ask_one(project, n)))


def start_asks(project: Project) -> dict[str, Future[Answer]]:
    """Every host asked at once, each on a daemon thread (`start_each`): `finish_asks` need not wait
    for a host it learns meanwhile to be gone."""
    return start_each(project.hosts, lambda n: ask_one(project, n))


def finish_asks(project: Project, futures: Mapping[str, Future[Answer]], gone: Mapping[str, str]) -> Asked:
    """`start_asks`'s answers as `ask_hosts` gives them; a host in `gone` (host -> why) is not waited
    for: unknown sessions, unreachable for that reason."""
    got: FanOut[str, Answer] = gather(futures, {h: AblateError(why) for h, why in gone.items()})
    return assemble(project, got)


def assemble(project: Project, answers: Mapping[str, Answer | Exception | None]) -> Asked:
    """Per host its answer (or why there is none) as an `Asked`."""
    asked = Asked()
    for name in project.hosts:
        got = answers.get(name)
        if not isinstance(got, tuple):
            asked.sessions[name] = None
            text = str(got) if got is not None else "not asked"
            asked.unreachable[name] = text.splitlines()[0] if text else type(got).__name__
            continue
        (sessions, why), (view, vwhy) = got
        asked.sessions[name] = sessions
        if sessions is None:
            asked.unreachable[name] = (why or "tmux did not answer").splitlines()[0]
        if view is not None:
            asked.views[name] = view
        elif vwhy:
            asked.view_errors[name] = vwhy
    return asked


__all__ = ["MARK", "SCRIPT", "STORE_VIEW", "TMUX", "VIEW", "Answer", "Asked", "TmuxAnswer", "ask_hosts",
           "ask_one", "ask_split", "assemble", "finish_asks", "parse", "split_view", "start_asks",
           "tmux_answer", "view_answer", "view_args"]
