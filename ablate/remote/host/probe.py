"""Stdlib-only operations that read many files on the shared FS and answer with one JSON document.

Locally they run in-process; over SSH this module (with `ablate/remote/checkpoints/verify.py`) is
what a live host that mounts the FS runs, so a command costs one round trip, never one per file or per cell.
Usage on a host: `python3 probe.py OP JSON_ARGS` prints one JSON object; JSON_ARGS `-`: read them
from stdin (`apply`: its ops carry whole files). `apply` is the batch of writes of
`SharedFS.apply` (`ablate/remote/host/fs_writes.py`).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from ablate.remote.host import fs_writes
from ablate.remote.layout import ASIDE_PREFIX, RELEASE_PREFIX, RELEASE_SUFFIX, STAGING_PREFIX, SweepLayout

TYPE_CHECKING = False  # not `typing`'s: importing typing costs every probe start ~6 ms
if TYPE_CHECKING:
    from typing import Any


def fs_now(root: str) -> float:
    """The FS's own clock: touch a probe file and read its mtime (hosts' clocks disagree)."""
    path = SweepLayout(root).clock
    os.makedirs(root, exist_ok=True)
    with open(path, "w") as f:
        f.write(str(time.time()))
    return os.stat(path).st_mtime


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue  # a torn last line while the writer appends
                if isinstance(obj, dict):
                    out.append(obj)
    except OSError:
        pass
    return out


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _heartbeats(lay: SweepLayout, prefix: str) -> dict[str, Any]:
    """Every heartbeat whose name starts with `prefix` (not a hidden temp file): mtime + JSON."""
    out: dict[str, Any] = {}
    for fn in _listdir(lay.heartbeats):
        if fn.startswith(".") or not fn.startswith(prefix):
            continue
        path = os.path.join(lay.heartbeats, fn)
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        out[fn] = {"mtime": mtime, "data": _read_json(path)}
    return out


def snapshot(args: dict[str, Any]) -> dict[str, Any]:
    """Everything a reader of the sweep needs from the FS in one read (parsed by
    `ablate.sweep.snapshot.Snapshot.parse`): events, heartbeats, claims, results, ledgers, the FS
    copies of the queues, failure details, release approvals, the last reconcile record and the
    autostop watchers' files (`_autostop`; in the snapshot's `extra`)."""
    root = args["root"]
    lay = SweepLayout(root)
    now = fs_now(root) if args.get("touch", True) else time.time()
    events = {}
    for fn in _listdir(lay.events):
        if fn.endswith(".jsonl"):
            events[fn[: -len(".jsonl")]] = _read_jsonl(os.path.join(lay.events, fn))
    heartbeats = _heartbeats(lay, "")
    claims = {}
    for name in _listdir(lay.claims):
        try:
            with open(lay.claim_owner(name), encoding="utf-8") as f:
                claims[name] = f.read().strip()
        except OSError:
            claims[name] = ""
    final_entries = _listdir(lay.final)
    final = [n for n in final_entries if not n.startswith(".") and os.path.exists(lay.manifest(n))]
    ledgers = {}
    queues = {}
    for fn in _listdir(lay.queues):
        path = os.path.join(lay.queues, fn)
        if fn.endswith(".ledger"):
            ledgers[fn[: -len(".ledger")]] = _read_jsonl(path)
        elif fn.endswith(".txt") and not fn.startswith("."):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    queues[fn[: -len(".txt")]] = f.read()
            except OSError:
                pass
    approvals = {}
    for fn in _listdir(lay.gate):
        if fn.startswith(RELEASE_PREFIX) and fn.endswith(RELEASE_SUFFIX):
            path = os.path.join(lay.gate, fn)
            rec = _read_json(path)
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                continue
            host = fn[len(RELEASE_PREFIX): -len(RELEASE_SUFFIX)]
            approvals[host] = {**rec, "mtime": mtime} if isinstance(rec, dict) else None
    return {"now": now, "events": events, "heartbeats": heartbeats, "claims": claims,
            "final": final, "ledgers": ledgers, "queues": queues, "approvals": approvals,
            "reconcile": _read_json(lay.reconcile_record), "fs_lag": _read_json(lay.fs_lag),
            **_autostop(root), "resume": _resume_copies(root),
            **_failure_details(lay, final_entries, final, int(args.get("tail_lines", TAIL_LINES)))}


AUTOSTOP_DIR = "autostop"  # <root>/autostop/: each instance's autostop watcher and its controls


def _autostop(root: str) -> dict[str, Any]:
    """What the autostop watchers and the controller left in `autostop/` (one listdir): each
    host's last verdict (`<host>.state.json`, the watcher's, rewritten at every check), the hosts
    whose autostop is on (`<host>.settings.json`, written at launch) and each host's control
    record (`<host>.control.json`, `ablate autostop`'s). No directory: all empty."""
    d = os.path.join(root, AUTOSTOP_DIR)
    states: dict[str, Any] = {}
    on: list[str] = []
    control: dict[str, Any] = {}
    for fn in _listdir(d):
        if fn.endswith(".state.json"):  # (a temp file of an atomic write has another suffix)
            rec = _read_json(os.path.join(d, fn))
            if isinstance(rec, dict):
                states[fn[: -len(".state.json")]] = rec
        elif fn.endswith(".settings.json"):
            on.append(fn[: -len(".settings.json")])
        elif fn.endswith(".control.json"):
            control[fn[: -len(".control.json")]] = _read_json(os.path.join(d, fn))
    return {"autostop": states, "autostop_on": on, "autostop_control": control}


def autostop(args: dict[str, Any]) -> dict[str, Any]:
    """`ablate autostop`'s read: the FS clock, `autostop/` as `snapshot` reads it, and the ledgers
    (a launch after a host stopped itself means it is back)."""
    root = args["root"]
    lay = SweepLayout(root)
    now = fs_now(root) if args.get("touch", True) else time.time()
    ledgers = {fn[: -len(".ledger")]: _read_jsonl(os.path.join(lay.queues, fn))
               for fn in _listdir(lay.queues) if fn.endswith(".ledger")}
    return {"now": now, "ledgers": ledgers, **_autostop(root)}


TAIL_LINES = 40
# What classification calls an out-of-memory death in a cell's log tail (container OOM kills often
# leave only exit 137 and a shell's "Killed"; CUDA and Python say so in the trace).
OOM_RE = re.compile(r"(?i:out of memory)|OutOfMemoryError|\bMemoryError\b|\bKilled\b|\boom[-_ ]kill")


def _resume_copies(root: str) -> dict[str, list[dict[str, Any]]]:
    """Each cell's committed resume copies (`resume/<cell>/<n>/RESUME.json`, ablate/remote/resume/),
    newest first: {seq, step, committed, made_on, top}. Only cells with a copy have a directory."""
    d = os.path.join(root, "resume")
    out: dict[str, list[dict[str, Any]]] = {}
    for cell in _listdir(d):
        if cell.startswith("."):
            continue
        seqs = sorted((int(n) for n in _listdir(os.path.join(d, cell)) if n.isdigit()), reverse=True)
        for seq in seqs:
            rec = _read_json(os.path.join(d, cell, str(seq), "RESUME.json"))
            if not isinstance(rec, dict):
                continue
            files = [f.get("path") for f in rec.get("files") or [] if isinstance(f, dict)]
            top = sorted({str(f).split("/")[0] for f in files if isinstance(f, str)})
            src = rec.get("source")
            out.setdefault(cell, []).append({"seq": seq, "step": rec.get("step"), "top": top[:3],
                                             "committed": rec.get("committed"),
                                             "made_on": src.get("host") if isinstance(src, dict) else None})
    return out


def _failure_details(lay: SweepLayout, entries: list[str], final: list[str],
                     tail_lines: int) -> dict[str, Any]:
    """What `ablate.sweep.classify` needs beyond status, in the same round trip: each published
    result's manifest identity, result dirs without a MANIFEST.json (partial), leftover staging
    dirs, the failed cells' log tails (`tails/<name>.log`), each events file's mtime (FS clock: a
    host's last event) and the claims remediate released."""

    manifests = {name: _manifest(lay, name) for name in final}
    published = set(final)
    partial = [n for n in entries if not n.startswith(".") and n not in published
               and os.path.isdir(lay.final_dir(n))]
    staging = [n for n in entries if n.startswith(STAGING_PREFIX)]
    aside = [n for n in entries if n.startswith(ASIDE_PREFIX)]
    tails: dict[str, Any] = {}
    for fn in _listdir(lay.tails):
        if fn.startswith(".") or not fn.endswith(".log"):
            continue
        tail = _tail(os.path.join(lay.tails, fn), tail_lines)
        if tail is not None:
            tails[fn[: -len(".log")]] = tail
    events_mtime: dict[str, float] = {}
    for fn in _listdir(lay.events):
        if fn.endswith(".jsonl"):
            try:
                st = os.stat(os.path.join(lay.events, fn))
            except OSError:
                continue
            events_mtime[fn[: -len(".jsonl")]] = st.st_mtime
    released: dict[str, list[str]] = {}
    for entry in _listdir(lay.released):
        m2 = RELEASED_RE.match(entry)
        if m2:
            released.setdefault(m2.group(1), []).append(entry)
    return {"manifests": manifests, "partial": partial, "staging": staging, "aside": aside, "tails": tails,
            "events_mtime": events_mtime, "released": released}


def _manifest(lay: SweepLayout, name: str) -> dict[str, Any] | None:
    """A published result's manifest identity (None: it vanished while read)."""
    import hashlib

    try:
        with open(lay.manifest(name), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    try:
        m = json.loads(raw)
    except ValueError:
        m = None
    m = m if isinstance(m, dict) else {}
    try:
        mtime: float | None = os.stat(lay.manifest(name)).st_mtime
    except OSError:
        mtime = None
    return {"sha256": hashlib.sha256(raw).hexdigest(), "valid": bool(m), "mtime": mtime,
            **{k: m.get(k) for k in ("cfg", "task", "epochs", "cfg_sha256", "host", "queue")}}


def _tail(path: str, tail_lines: int) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ln[:500] for ln in f.read(1 << 20).splitlines()]
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    oom = next((ln for ln in lines if OOM_RE.search(ln) and not ln.startswith("# ablate")), None)
    return {"lines": lines[-tail_lines:] if tail_lines > 0 else [], "oom": oom, "mtime": mtime}


def _tmux_sessions(argv: list[str]) -> dict[str, Any]:
    """`<tmux> list-sessions -F '#{session_name}' 2>&1` and its exit code, as the shell's
    `hostview.TMUX` gives them (127: no such command)."""
    import subprocess  # the agent that forks this has it loaded

    try:
        r = subprocess.run([*argv, "list-sessions", "-F", "#{session_name}"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    except OSError as e:
        return {"out": f"{argv[0]}: {e.strerror or e}", "rc": 127}
    except subprocess.TimeoutExpired:
        return {"out": "tmux list-sessions did not answer within 60s", "rc": 124}
    return {"out": r.stdout.decode(errors="replace"), "rc": r.returncode}


def _on_path(name: str) -> str | None:
    for d in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _live(args: dict[str, Any], heartbeats: dict[str, Any], host: str) -> dict[str, Any]:
    """What `ablate.monitor.hostinfo.REST` prints, as data: nvidia-smi's answer (None: no
    nvidia-smi here), and the last `bytes` of the log (`<ckpt_root>/<cell>.log`) of each cell this
    host's own heartbeats say runs (`missing`: no log here)."""
    import subprocess  # the agent that forks this has it loaded

    gpu = None
    smi = _on_path("nvidia-smi")
    if smi is not None:
        try:
            r = subprocess.run([smi, f"--query-gpu={args['gpu_query']}", "--format=csv,noheader,nounits"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=30)
            gpu = "\n".join(r.stdout.decode(errors="replace").splitlines()[:64])
        except (OSError, subprocess.TimeoutExpired) as e:
            gpu = f"nvidia-smi: {e}"
    tails: dict[str, str] = {}
    missing: list[str] = []
    n = int(args["bytes"])
    for beat in heartbeats.values():
        data = beat["data"]
        if not isinstance(data, dict) or data.get("host") != host or data.get("state") != "running":
            continue
        cell = data.get("cell")
        if not isinstance(cell, str) or not cell or "/" in cell or cell.startswith("."):
            continue
        try:
            with open(os.path.join(args["ckpt_root"], cell + ".log"), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - n))
                tails[cell] = f.read(n).decode(errors="replace")
        except FileNotFoundError:
            missing.append(cell)
        except OSError:
            tails[cell] = ""  # as `tail` failing quietly
    return {"gpu": gpu, "tails": tails, "missing": missing}


def mine(args: dict[str, Any]) -> dict[str, Any]:
    """What host `args["host"]` itself wrote, read through its own mount (a network FS's client
    caches are coherent for the client's own writes; another host's view of them may lag): its
    events files and heartbeats (`<host>.*`), and for every cell they name, its claim, published
    result, partial result dir and failure tail. The controller merges this over the snapshot read
    through the FS host (`ablate.sweep.snapshot.merge_views`). No clock touch: read-only.

    `args["tmux"]` (the host's tmux command line): its sessions are asked first, under `"tmux"`,
    and the view read only once tmux answered: a queue writes its `end` before its session ends,
    so every queue tmux no longer lists has its end in the view. `args["live"]` (`ckpt_root`,
    `bytes`, `gpu_query`): the GPUs and running cells' log tails `status` shows, under `"live"`."""
    argv = args.get("tmux")
    if argv is not None and not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError("mine: tmux must be a command line (a non-empty list of strings)")
    sessions = _tmux_sessions(argv) if argv else None
    lay = SweepLayout(args["root"])
    prefix = f"{args['host']}."
    tail_lines = int(args.get("tail_lines", TAIL_LINES))
    events: dict[str, list[dict[str, Any]]] = {}
    events_mtime: dict[str, float] = {}
    for fn in _listdir(lay.events):
        if fn.startswith(prefix) and fn.endswith(".jsonl"):
            path = os.path.join(lay.events, fn)
            try:
                events_mtime[fn[: -len(".jsonl")]] = os.stat(path).st_mtime
            except OSError:
                continue
            events[fn[: -len(".jsonl")]] = _read_jsonl(path)
    heartbeats = _heartbeats(lay, prefix)
    cells = {e["cell"] for evs in events.values() for e in evs if isinstance(e.get("cell"), str)}
    cells |= {hb["data"]["cell"] for hb in heartbeats.values()
              if isinstance(hb["data"], dict) and isinstance(hb["data"].get("cell"), str)}
    cells = {c for c in cells if c and "/" not in c and not c.startswith(".")}
    claims: dict[str, str] = {}
    final: list[str] = []
    manifests: dict[str, Any] = {}
    partial: list[str] = []
    tails: dict[str, Any] = {}
    for name in sorted(cells):
        if os.path.isdir(lay.claim(name)):
            try:
                with open(lay.claim_owner(name), encoding="utf-8") as f:
                    claims[name] = f.read().strip()
            except OSError:
                claims[name] = ""
        if os.path.exists(lay.manifest(name)):
            final.append(name)
            manifests[name] = _manifest(lay, name)
        elif os.path.isdir(lay.final_dir(name)):
            partial.append(name)
        tail = _tail(lay.tail(name), tail_lines)
        if tail is not None:
            tails[name] = tail
    doc = {"host": args["host"], "events": events, "events_mtime": events_mtime, "heartbeats": heartbeats,
           "claims": claims, "final": final, "manifests": manifests, "partial": partial, "tails": tails}
    if sessions is not None:
        doc["tmux"] = sessions
    if isinstance(args.get("live"), dict):
        doc["live"] = _live(args["live"], heartbeats, args["host"])
    return doc


RELEASED_RE = re.compile(r"^(.+)\.(\d+\.\d+)$")  # released/<name>.<t>: t as epoch seconds, 3 decimals


def verify(args: dict[str, Any]) -> dict[str, Any]:
    from ablate.remote.checkpoints import verify as v  # stdlib-only at import

    return v.verify_tree(args)


def now(args: dict[str, Any]) -> dict[str, Any]:
    return {"now": fs_now(args["root"])}


MAX_METRICS_BYTES = 4 << 20  # a metrics file beyond this is a log, not a summary: reported, not read


def metric_numbers(obj: Any, prefix: str = "", depth: int = 0) -> dict[str, int | float]:
    """The numbers of a metrics JSON object as flat `key` / `outer.inner` columns (nested objects
    to depth 3; lists, strings, booleans and non-finite numbers dropped; ints stay ints)."""
    out: dict[str, int | float] = {}
    if not isinstance(obj, dict) or depth > 2:
        return out
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(metric_numbers(v, key + ".", depth + 1))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf"):
            out[key] = v
    return out


def read_metrics(path: str) -> tuple[dict[str, int | float] | None, str | None]:
    """(numbers, error) of one metrics file."""
    try:
        size = os.stat(path).st_size
        if size > MAX_METRICS_BYTES:
            return None, f"{size} bytes: larger than {MAX_METRICS_BYTES} (not read)"
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None, "no metrics file"
    except (OSError, ValueError) as e:
        return None, f"unreadable: {e}"
    if not isinstance(data, dict):
        return None, f"not a JSON object ({type(data).__name__})"
    return metric_numbers(data), None


def report(args: dict[str, Any]) -> dict[str, Any]:
    """`snapshot` plus what `ablate report` reads beyond it: the numbers of every published result's
    metrics file (args["metrics"], its path inside the result dir) as `metrics: {name: {"values",
    "error"}}`: the whole report in one round trip."""
    out = snapshot(args)
    lay = SweepLayout(args["root"])
    metrics: dict[str, Any] = {}
    if args.get("metrics"):
        for name in out["final"]:
            values, error = read_metrics(os.path.join(lay.final_dir(name), args["metrics"]))
            metrics[name] = {"values": values, "error": error}
    out["metrics"] = metrics
    return out


def queue_copies(args: dict[str, Any]) -> dict[str, Any]:
    """The FS copies of the launched queues (`queues/<q>.txt`): the roster a controller without
    its local queue files (a lost or second laptop) rebuilds."""
    qdir = SweepLayout(args["root"]).queues
    queues = {}
    for fn in _listdir(qdir):
        if fn.endswith(".txt") and not fn.startswith("."):
            try:
                with open(os.path.join(qdir, fn), encoding="utf-8", errors="replace") as f:
                    queues[fn[: -len(".txt")]] = f.read()
            except OSError:
                pass
    return {"queues": queues}


OPS = {"snapshot": snapshot, "mine": mine, "verify": verify, "now": now, "report": report,
       "queues": queue_copies, "apply": fs_writes.apply, "autostop": autostop}


def run(op: str, args: dict[str, Any]) -> Any:
    if op not in OPS:
        raise ValueError(f"unknown probe op {op!r}")
    return OPS[op](args)


def main(argv: list[str]) -> None:
    """`OP JSON_ARGS` (`-`: the JSON on stdin): print the op's one JSON document."""
    given = json.load(sys.stdin) if argv[1] == "-" else json.loads(argv[1])
    print(json.dumps(run(argv[0], given)))


# How a host runs the probe: `-c` with this, not `-m` (runpy's imports cost ~10 ms a start).
ENTRY = "import sys; from ablate.remote.host.probe import main; main(sys.argv[1:])"

if __name__ == "__main__":
    main(sys.argv[1:])
