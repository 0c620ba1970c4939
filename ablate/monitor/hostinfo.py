"""Live data from the hosts for `status` and the dashboard: the tail of each running cell's log
(parsed for epoch and metric) and GPU utilisation/memory from `nvidia-smi` where it exists.

One command per host, all hosts in parallel (`fan_out`): a host that does not answer costs one
time-out and never hides the others. The command reads the instance-local logs
(`<ckpt_root>/<name>.log`, as `run_one` writes them) by their last bytes, not lines: a trainer's
progress bar rewrites one "line" with `\\r` thousands of times.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

from ablate.config.project import Project
from ablate.sweep import hostview
from ablate.transport import fan_out, fanout, host_transport
from ablate.transport.shellhost import BASH_C

TAIL_BYTES = 16384
_MARK = hostview.MARK
_GPU_QUERY = "index,name,utilization.gpu,memory.used,memory.total"
# $1 ckpt_root, $2 bytes, $3 the sweep's heartbeats dir (as this host sees it), $4 the host's name:
# GPUs, then the log tails of the cells this host's own heartbeats say run (`"state": "running"`,
# `"cell": "<name>"`): nothing from the FS snapshot, so it runs alongside it.
REST = r"""if command -v nvidia-smi >/dev/null 2>&1; then
  printf '\036ablate gpu\n'
  nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits 2>&1 | head -n 64
fi
re_h='"host": *"([^"]*)"'; re_s='"state": *"([^"]*)"'; re_c='"cell": *"([^"]*)"'
for f in "$hb/$me".*; do
  [ -f "$f" ] || continue
  s=$(<"$f") || continue
  [[ $s =~ $re_h && ${BASH_REMATCH[1]} == "$me" ]] || continue
  [[ $s =~ $re_s && ${BASH_REMATCH[1]} == running ]] || continue
  [[ $s =~ $re_c ]] || continue
  c=${BASH_REMATCH[1]}
  printf '\n\036ablate log %s\n' "$c"
  [ -e "$root/$c.log" ] || { printf '\036ablate missing\n'; continue; }
  tail -c "$n" -- "$root/$c.log" 2>/dev/null
done
exit 0
""".replace("GPU_QUERY", _GPU_QUERY)
# The host's one script: $5-$8 the view's arguments (`ablate.sweep.hostview.view_args`), then the
# host's tmux command line; its sessions and its own view of what it wrote come first (the
# snapshot's per-host part, in the same round trip: `hostview`).
SCRIPT = ("root=$1; n=$2; hb=$3; me=$4; vd=$5; ve=$6; vp=$7; va=$8; shift 8\n" + hostview.TMUX + hostview.VIEW
          + REST)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    util: float | None  # percent
    mem_used: int | None  # MiB
    mem_total: int | None  # MiB


@dataclass(frozen=True)
class LogProgress:
    epoch: float | None
    epochs: int | None
    metric: str | None
    value: float | None
    line: str  # the last line that said something (trimmed), for a human

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def short(self) -> str:
        parts = []
        if self.epoch is not None:
            ep = f"{self.epoch:g}"
            parts.append(f"ep {ep}/{self.epochs}" if self.epochs else f"ep {ep}")
        if self.metric is not None and self.value is not None:
            parts.append(f"{self.metric} {self.value:.4g}")
        return " ".join(parts)


@dataclass
class HostLive:
    host: str
    gpus: list[Gpu] | None = None  # None: no nvidia-smi on the host
    gpu_error: str | None = None  # nvidia-smi exists but said something else (driver gone)
    tails: dict[str, str] = field(default_factory=dict)  # cell -> the last bytes of its log
    missing: list[str] = field(default_factory=list)  # cells whose log is not on this host
    sessions: set[str] | None = None  # its tmux sessions (None: tmux could not be asked)
    tmux_error: str | None = None
    view: dict[str, Any] | None = None  # its own view of what it wrote (ablate.sweep.hostview)
    view_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"gpus": None if self.gpus is None else [asdict(g) for g in self.gpus],
                "gpu_error": self.gpu_error, "error": None}


def host_live(project: Project, host: str, nbytes: int = TAIL_BYTES, timeout: float = 20.0) -> HostLive:
    """Ask one host, in one command: `SCRIPT`, or where its agent runs the probe
    (`hostview.split_view`), the `mine` probe with tmux and these (`hostview.ask_split`), no shell
    at all. Raises the transport's error when the host cannot be reached."""
    h = project.host(host)
    t = host_transport(project, h)

    def script(view: Sequence[str]) -> str:
        argv = [*BASH_C, SCRIPT, "bash", h.ckpt_root, str(nbytes), project.layout(h).heartbeats, h.name,
                *view, *t.tmux_argv()]
        return t.run(argv, timeout=timeout).check().stdout

    args = hostview.view_args(project, host)
    if not hostview.split_view(t, args):
        return parse_output(host, script(args))
    wanted = {"ckpt_root": h.ckpt_root, "bytes": nbytes, "gpu_query": _GPU_QUERY}
    tmux, view, shown = hostview.ask_split(t, args, timeout, wanted)
    if tmux is None or shown is None:  # the probe did not run there (the view's answer says why)
        live = parse_output(host, script(["", "", "", ""]))
    else:
        live = live_of(host, shown)
        live.sessions, live.tmux_error = tmux
    live.view, live.view_error = view
    return live


def live_of(host: str, shown: Mapping[str, Any]) -> HostLive:
    """The probe's `live` part (`ablate.remote.host.probe._live`) as `parse_output` reads `REST`'s."""
    live = HostLive(host)
    if isinstance(shown.get("gpu"), str):
        live.gpus, live.gpu_error = parse_gpus(shown["gpu"])
    tails = shown.get("tails")
    live.tails = {str(c): str(v) for c, v in tails.items()} if isinstance(tails, dict) else {}
    missing = shown.get("missing")
    live.missing = [str(c) for c in missing] if isinstance(missing, list) else []
    return live


def parse_output(host: str, text: str) -> HostLive:
    live = HostLive(host)
    tmux_out: list[str] = []
    view_out: list[str] = []
    section: str | None = None
    cell = ""
    body: list[str] = []

    def close() -> None:
        joined = "\n".join(body)
        if section == "gpu":
            live.gpus, live.gpu_error = parse_gpus(joined)
        elif section == "tmux":
            tmux_out.extend(body)
        elif section == "view":
            view_out.extend(body)
        elif section == "log":
            live.tails[cell] = joined
        body.clear()

    for line in text.split("\n"):
        if line.startswith(_MARK + " "):
            kind, _, rest = line[len(_MARK) + 1:].partition(" ")
            if kind == "missing":
                live.missing.append(cell)
                section = None
                continue
            if kind == "tmuxrc":
                close()
                section = None
                live.sessions, live.tmux_error = hostview.tmux_answer(tmux_out, rest)
                continue
            if kind == "viewrc":
                close()
                section = None
                live.view, live.view_error = hostview.view_answer(view_out, rest)
                continue
            close()
            section, cell = kind, rest
            continue
        if section is not None:
            body.append(line)
    close()
    for c in live.missing:
        live.tails.pop(c, None)
    return live


def parse_gpus(text: str) -> tuple[list[Gpu], str | None]:
    """`nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total
    --format=csv,noheader,nounits` → GPUs; a line that is not such a record is the error."""
    gpus: list[Gpu] = []
    errors: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not parts[0].isdigit():
            errors.append(line.strip())
            continue
        gpus.append(Gpu(int(parts[0]), parts[1], _num(parts[2]), _int(parts[3]), _int(parts[4])))
    return gpus, ("; ".join(errors)[:300] if errors else None)


def _num(s: str) -> float | None:
    try:
        return float(s.rstrip("%").strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _int(s: str) -> int | None:
    v = _num(s.replace("MiB", ""))
    return None if v is None else int(v)


# --------------------------------------------------------------------------- log progress


def log_lines(tail: str) -> list[str]:
    """The tail's lines, `\\r`-rewritten progress bars split into their updates, ANSI removed.
    (A first line cut mid-word cannot fake a match: names must start at a word boundary.)"""
    clean = _ANSI.sub("", tail)
    rows = re.split(r"\r\n|\r|\n", clean)
    return [r for r in rows if r.strip()]


def _canon(name: str) -> str:
    """`eval_loss`, `val/loss`, `Val Loss`, `validation_loss` → `val_loss`."""
    n = re.sub(r"[\s/]+", "_", name.strip().lower())
    return re.sub(r"^(eval|valid|validation)_", "val_", n)


_VALIDATION = re.compile(r"(?i)^(val|eval|valid|test)")


def parse_progress(tail: str | Iterable[str], epoch_re: str, metric_re: str,
                   main_metric: str | None = None) -> LogProgress | None:
    """The latest epoch (group 1, total in optional group 2) and main metric (group 1 name, group 2
    value) in a log tail. The main metric is `main_metric` when the log names it, else the latest
    validation-like one (val/eval/valid/test; the first of its line: usually the loss), else the
    latest. Lines of `# ablate …` are skipped."""
    lines = log_lines(tail) if isinstance(tail, str) else list(tail)
    ep_rx, m_rx = re.compile(epoch_re), re.compile(metric_re)
    epoch: float | None = None
    epochs: int | None = None
    pairs: list[tuple[int, str, float]] = []  # (line number, name, value), oldest first
    last_line = ""
    for i, line in enumerate(lines):
        if line.startswith("# ablate"):
            continue
        said = False
        for m in ep_rx.finditer(line):
            try:
                epoch = float(m.group(1))
            except (TypeError, ValueError):
                continue
            total = m.group(2) if (m.re.groups >= 2) else None
            epochs = int(total) if total and total.isdigit() else None
            said = True
        for m in m_rx.finditer(line):
            try:
                pairs.append((i, m.group(1).strip(), float(m.group(2))))
            except (TypeError, ValueError):
                continue
            said = True
        if said:
            last_line = line.strip()
    if epoch is None and not pairs:
        return None
    metric: tuple[int, str, float] | None = None
    if pairs:
        want = _canon(main_metric) if main_metric else None
        named = [p for p in pairs if want is not None and _canon(p[1]) == want]
        val = [p for p in pairs if _VALIDATION.match(p[1])]
        if named:
            metric = named[-1]
        elif val:
            metric = next(p for p in val if p[0] == val[-1][0])
        else:
            metric = pairs[-1]
    return LogProgress(epoch, epochs, metric[1] if metric else None, metric[2] if metric else None,
                       last_line[-200:])


# --------------------------------------------------------------------------- status


def gather(project: Project, hosts: Sequence[str] | None = None,
           nbytes: int = TAIL_BYTES) -> dict[str, HostLive | Exception]:
    """Every host (or those named), in parallel: its GPUs and its running cells' log tails."""
    names = list(project.hosts) if hosts is None else list(hosts)
    return dict(fan_out(names, lambda h: host_live(project, h, nbytes)))


# A host's query still out from an earlier call (`status --watch` asks every interval): answered
# once, not queued up behind its own connect time-outs. (project dir, sweep, host, live) -> answer.
_PENDING: dict[tuple[str, str, str, bool], Future[HostLive]] = {}
_PENDING_LOCK = threading.Lock()


def _tmux_and_view(project: Project, host: str) -> HostLive:
    """`hostview.ask_one` (tmux and the host's own view, nothing live) as a `HostLive`."""
    (sessions, why), (view, vwhy) = hostview.ask_one(project, host)
    return HostLive(host, sessions=sessions, tmux_error=why, view=view, view_error=vwhy)


def ask_each(project: Project, live: bool = True, nbytes: int = TAIL_BYTES) -> dict[str, Future[HostLive]]:
    """Every host asked at once, each on a daemon thread of its own (`fanout.start_each`), so that a
    caller may leave a host's answer unawaited (one that stopped itself: `status`) without anything,
    the interpreter's exit included, waiting on its connect time-out. `live`: `host_live` (GPUs, log
    tails), else its tmux and view alone (`hostview.ask_one`). A host whose query from an earlier
    call is still out is not asked again: that query's answer is this one's."""
    def ask(name: str) -> HostLive:
        return host_live(project, name, nbytes) if live else _tmux_and_view(project, name)

    def key(name: str) -> tuple[str, str, str, bool]:
        return str(project.dir), project.sweep, name, live

    with _PENDING_LOCK:
        todo = [n for n in project.hosts if (f := _PENDING.get(key(n))) is None or f.done()]
        _PENDING.update((key(n), f) for n, f in fanout.start_each(todo, ask).items())
        return {n: _PENDING[key(n)] for n in project.hosts}


def collect(futures: Mapping[str, Future[HostLive]], skip: Collection[str] = ()
            ) -> dict[str, HostLive | Exception]:
    """The answers of `ask_each`, as `gather` gives them; a host in `skip` is waited for not at all:
    its answer is used only when it came already and is one (tmux answered), else it is left out."""
    waited: fanout.FanOut[str, HostLive] = fanout.gather({h: f for h, f in futures.items() if h not in skip})
    out: dict[str, HostLive | Exception] = dict(waited)
    for host in skip:
        fut = futures.get(host)
        got = fut.result() if fut is not None and fut.done() and fut.exception() is None else None
        if got is not None and got.sessions is not None:
            out[host] = got
    return out


def asked_of(project: Project, got: Mapping[str, HostLive | Exception]) -> hostview.Asked:
    """Each host's tmux sessions (None: not known), why the unknown ones are, and the hosts' own
    views, from a `gather`: what `ablate.sweep.hostview.ask_hosts` gives."""
    sessions: dict[str, set[str] | None] = {}
    unreachable: dict[str, str] = {}
    views: dict[str, dict[str, Any]] = {}
    view_errors: dict[str, str] = {}
    for name in project.hosts:
        live = got.get(name)
        if isinstance(live, HostLive) and live.view is not None:
            views[name] = live.view
        elif isinstance(live, HostLive) and live.view_error:
            view_errors[name] = live.view_error
        if isinstance(live, HostLive) and live.sessions is not None:
            sessions[name] = set(live.sessions)
            continue
        sessions[name] = None
        why = (live.tmux_error if isinstance(live, HostLive) else str(live) if live is not None
               else "not asked")
        unreachable[name] = (why or "tmux did not answer").splitlines()[0]
    return hostview.Asked(sessions, unreachable, views, view_errors)


def attach_live(project: Project, report: Any,
                got: Mapping[str, HostLive | Exception] | None = None) -> None:
    """Fill `row.progress` of each running row and `report.hosts` (GPUs, or why not) in place,
    from `got` (a `gather` run alongside the FS snapshot) or asking now. A host that `report`
    found unreachable is not asked again."""
    unreachable: Mapping[str, str] = getattr(report, "unreachable", {}) or {}
    if got is None:
        got = gather(project, [h for h in project.hosts if h not in unreachable])
    hosts: dict[str, dict[str, Any]] = {}
    for host in project.hosts:
        live = got.get(host)
        if live is None or host in unreachable:
            hosts[host] = {"gpus": None, "gpu_error": None, "error": unreachable.get(host, "not asked")}
        elif isinstance(live, Exception):
            msg = str(live).splitlines()[0] if str(live) else type(live).__name__
            hosts[host] = {"gpus": None, "gpu_error": None, "error": msg}
        else:
            hosts[host] = live.to_json()
    mon = project.monitor
    for row in report.rows:
        live = got.get(row.host) if row.host else None
        if not row.current or not isinstance(live, HostLive) or row.current not in live.tails:
            continue
        prog = parse_progress(live.tails[row.current], mon.epoch_re, mon.metric_re, project.report.metric)
        row.progress = prog.to_json() if prog else None
    report.hosts = hosts


def gpu_text(g: Mapping[str, Any]) -> str:
    util = "-" if g.get("util") is None else f"{g['util']:.0f}%"
    used, total = g.get("mem_used"), g.get("mem_total")
    mem = f"{used / 1024:.1f}/{total / 1024:.1f} GiB" if used is not None and total else "-"
    return f"GPU{g.get('index')} {util} {mem}"


def progress_text(progress: Mapping[str, Any] | None) -> str:
    if not progress:
        return ""
    return LogProgress(progress.get("epoch"), progress.get("epochs"), progress.get("metric"),
                       progress.get("value"), str(progress.get("line") or "")).short()


def live_lines(report: Any) -> list[str]:
    """The plain-text lines of the live data (after `status`'s table): progress of each running
    cell, and the GPUs of each host that has nvidia-smi."""
    out = []
    for r in report.rows:
        text = progress_text(getattr(r, "progress", None))
        if r.current and text:
            out.append(f"progress {r.queue} {r.current}: {text}")
    for host, info in (getattr(report, "hosts", None) or {}).items():
        if info.get("gpus"):
            out.append(f"gpus {host}: " + "  ".join(gpu_text(g) for g in info["gpus"]))
        elif info.get("gpu_error"):
            out.append(f"gpus {host}: nvidia-smi failed: {info['gpu_error']}")
    return out
