"""The autostop watcher: one process per sweep per instance that stops the instance itself once its
work is done and verified (issue 46; the decision is `ablate/remote/host/autostop.py`). Stdlib only,
in the runner's zipapp; the controller can be absent throughout.

    python3 runner.<sha12>.pyz autostop ROOT HOST

Started by the first queue's runner process on the instance (`ensure`, from `serve`) when the launch
wrote `autostop/<host>.settings.json`; detached (a session of its own), so it outlives its queues;
one per sweep and host (an flock in the instance's temp dir). At each check (every heartbeat, or
sooner when its stop time comes first) it reads on the sweep's storage, under `ROOT/autostop/`:

- `<host>.settings.json` (the launch's: `idle`, `command`, `keep`, `artifacts`, `steal`,
  `heartbeat`, `tasks`); gone → autostop is off for it, and it ends;
- `<host>.control.json` (`ablate autostop`: `cancelled`, `idle`);
- the sweep (ledgers, lines, claims, results, heartbeats: `autostop.gather_fs`), its published
  results verified in place
  (`autostop.unverified_of`), and, while cells wait for remediation, who stays
  (`keepers.<gen>.json`, elected once per generation: a new one only when every keeper of the last
  has stopped);

and writes `<host>.state.json` (what it waits for: `kind`, `why`, times on the FS's clock) and, at
each change, a line of `<host>.jsonl`. When the verdict is `stop` it checks once more, with every
result verified again from scratch, records `stopping` and runs the command through `sh -c`. Exit 0:
`stopped` (the instance is expected to go; if it is still up after `SETTLE` seconds, `stop_failed`).
Otherwise `stop_failed` with the command's output; it tries again after `retry_after(idle)`.
Nothing it cannot read ever stops an instance: an unreadable sweep is `unsure`.

On a storage host ROOT is the instance's own copy of the sweep, kept in step with the store by
`StoreSide` (autostop_store.py): a store it cannot read is `unsure`; no stop the store did not hear of.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from ablate.remote.host import autostop
from ablate.remote.host.autostop import Facts, Settings, Unsure, Verdict
from ablate.remote.store.client import StoreError

if TYPE_CHECKING:
    from ablate.remote.host.autostop_store import StoreSide

SETTLE = 300.0  # seconds a stopped instance may take to go before its stop counts as failed
COMMAND_TIMEOUT = 300.0  # seconds the stop command may run
OUT_TAIL = 400  # characters of the stop command's output kept
ACTS = ("stopping", "stopped", "stop_failed")  # what it did, each an event of its own


def retry_after(idle: float) -> float:
    """Seconds between two tries of a stop command that failed: a minute at least, ten at most."""
    return max(60.0, min(600.0, idle))


def _dir(root: str) -> str:
    return os.path.join(root, "autostop")


def settings_path(root: str, host: str) -> str:
    return os.path.join(_dir(root), f"{host}.settings.json")


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, obj: Mapping[str, Any]) -> None:
    """tmp + rename: a reader never sees half of it."""
    tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _append(path: str, obj: Mapping[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj, sort_keys=True) + "\n")


def fs_now(root: str, host: str) -> float:
    """The FS's clock (its files' mtimes are on it): a file of ours touched, its mtime read."""
    path = os.path.join(_dir(root), f".clock.{host}")
    with open(path, "w") as f:
        f.write(f"{time.time()}\n")
    return os.stat(path).st_mtime


# ------------------------------------------------------------------ settings

class Config:
    """What one check runs by: the launch's settings with `ablate autostop`'s changes applied."""

    def __init__(self, raw: Mapping[str, Any], control: Any) -> None:
        ctrl = control if isinstance(control, dict) else {}
        idle = ctrl.get("idle") if isinstance(ctrl.get("idle"), (int, float)) else raw.get("idle")
        self.settings = Settings(idle=float(idle) if isinstance(idle, (int, float)) else 600.0,
                                 command=str(raw.get("command") or ""),
                                 keep=int(raw.get("keep", 1)) if isinstance(raw.get("keep", 1), int) else 1)
        self.cancelled = ctrl.get("cancelled") is True
        arts = raw.get("artifacts")
        self.artifacts: dict[str, Any] = dict(arts) if isinstance(arts, dict) else {}
        self.steal = raw.get("steal") is True
        hb = raw.get("heartbeat")
        self.heartbeat = float(hb) if isinstance(hb, (int, float)) and hb > 0 else 60.0
        tasks = raw.get("tasks")
        self.tasks = str(tasks) if isinstance(tasks, str) else ""
        load = raw.get("load")
        self.load = load is not False


def read_config(root: str, host: str) -> Config | None:
    raw = _read_json(settings_path(root, host))
    if not isinstance(raw, dict):
        return None
    return Config(raw, _read_json(os.path.join(_dir(root), f"{host}.control.json")))


# ------------------------------------------------------------------ what it asks of the sweep

def speeds(root: str, candidates: list[str]) -> dict[str, float]:
    """Each candidate's learned speed (its fastest slot; 1.0 without a figure): the sweep's ended
    cells fitted as a draining runner fits them, else the controller's estimates."""
    from ablate.remote.queue import learn, rules

    try:
        with open(os.path.join(root, "estimates.tsv"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        text = ""
    learned = learn.learned_text(text, learn.read_events(root), time.time()) if text else None
    est = rules.read_estimates(learned if learned is not None else text)
    out = {h: 1.0 for h in candidates}
    for (h, _slot), milli in est.speed.items():
        if h in out:
            out[h] = max(out[h] if out[h] != 1.0 else 0.0, milli / 1000)
    return out


def stopped_hosts(root: str) -> set[str]:
    """Hosts whose watcher recorded that it stopped its instance."""
    out = set()
    with contextlib.suppress(OSError):
        for n in os.listdir(_dir(root)):
            if n.endswith(".state.json") and not n.startswith("."):
                rec = _read_json(os.path.join(_dir(root), n))
                if isinstance(rec, dict) and rec.get("kind") in ("stopping", "stopped"):
                    out.add(n[: -len(".state.json")])
    return out


def autostop_hosts(root: str) -> list[str]:
    with contextlib.suppress(OSError):
        return sorted(n[: -len(".settings.json")] for n in os.listdir(_dir(root))
                      if n.endswith(".settings.json") and not n.startswith("."))
    return []


def keepers(root: str, host: str, keep: int, now: float,
            elect_once: Callable[..., tuple[str, ...]] = autostop.elect_once) -> tuple[str, ...]:
    """Who stays for remediation: the newest generation's election, or a new one when every keeper
    of the last has stopped (decided once per generation, on the sweep's storage: `elect_once`, the
    store's on a storage host)."""
    gens = []
    with contextlib.suppress(OSError):
        for n in os.listdir(_dir(root)):
            parts = n.split(".")
            if len(parts) == 3 and parts[0] == "keepers" and parts[2] == "json" and parts[1].isdigit():
                gens.append(int(parts[1]))
    stopped = stopped_hosts(root)
    live = [h for h in autostop_hosts(root) if h not in stopped]
    gen = max(gens, default=0)
    path = os.path.join(_dir(root), f"keepers.{gen}.json")
    if gen:
        chosen = elect_once(path, speeds(root, live), keep, host, now)
        if not chosen or any(h not in stopped for h in chosen):
            return chosen
        gen += 1  # every keeper of that generation has stopped: a new election among the live
    path = os.path.join(_dir(root), f"keepers.{gen or 1}.json")
    return elect_once(path, speeds(root, live), keep, host, now)


# ------------------------------------------------------------------ one check

class Watcher:
    def __init__(self, root: str, host: str, *, clock: Callable[[str, str], float] = fs_now,
                 run: Callable[[str], tuple[int, str]] | None = None, store: StoreSide | None = None) -> None:
        self.root, self.host = root, host
        self.clock = clock
        self.store = store  # a sweep kept in an object store: ROOT, its copy, kept in step by it
        hidden = store.credentials if store is not None else ()
        self.run = run or (lambda command: run_command(command, host, hidden))
        self.cache: dict[str, str | None] = {}  # manifest sha256s of its results verified
        self.last_kind: str | None = None
        self.failed: dict[str, Any] | None = None  # the last failed stop: {t, rc, out, why}
        self.stopped_at: float | None = None
        self.settle = SETTLE
        dir_ = _dir(root)
        os.makedirs(dir_, exist_ok=True)
        self.state_path = os.path.join(dir_, f"{host}.state.json")
        self.events_path = os.path.join(dir_, f"{host}.jsonl")

    def facts(self, cfg: Config, now: float, fresh_verify: bool = False) -> Facts:
        """What it sees, asked lazily in the decision's order: the verification and the election
        only when everything before them holds."""
        fresh = max(3 * cfg.heartbeat, 30.0)
        f = autostop.gather_fs(self.root, self.host, now, tasks=_tasks(cfg.tasks),
                               cancelled=cfg.cancelled, fresh=fresh)
        if cfg.cancelled or f.running:
            return f
        cache: dict[str, str | None] = {} if fresh_verify else self.cache
        if self.store is not None:
            self.store.verify_files(self.store.pending(cache))
        bad = autostop.unverified_of(self.root, self.host, cfg.artifacts, cache, load=cfg.load)
        if bad:
            return _with(f, unverified=bad)
        last = max(f.last_work, _mtime(settings_path(self.root, self.host)))
        others = autostop.other_sweeps(self.root, os.environ.get("ABLATE_AUTOSTOP_PROC", "/proc"))
        if f.waiting:
            elect = self.store.elect_once if self.store is not None else autostop.elect_once
            chosen = keepers(self.root, self.host, cfg.settings.keep, now, elect)
            return _with(f, keepers=chosen, last_work=last, others=others)
        return _with(f, last_work=last, others=others)

    def check(self) -> tuple[Verdict, Config | None, float, Facts | None]:
        unsynced = None
        if self.store is not None:
            try:
                self.store.sync()
            except StoreError as e:  # decided on nothing: the copy may be behind the store
                unsynced = str(e)
        cfg = read_config(self.root, self.host)
        now = self.clock(self.root, self.host)
        if unsynced is not None and cfg is not None:
            return Verdict("unsure", f"not deciding: the sweep's store: {unsynced}"), cfg, now, None
        if cfg is None:
            return Verdict("off", "autostop is off for this host (no settings from a launch)"), cfg, now, None
        try:
            f = self.facts(cfg, now)
        except Unsure as e:
            return Verdict("unsure", f"not deciding: {e}"), cfg, now, None
        v = autostop.decide(cfg.settings, f)
        if v.kind == "stop" and not cfg.settings.command.strip():
            v = Verdict("stop_failed", "no stop command set (autostop.command): it keeps billing")
        return v, cfg, now, f

    def record(self, v: Verdict, cfg: Config | None, now: float, f: Facts | None = None,
               **extra: Any) -> None:
        state = {"host": self.host, "kind": v.kind, "why": v.why, "t": now,
                 "every": cfg.heartbeat if cfg else None, "idle": cfg.settings.idle if cfg else None,
                 "stop_at": v.stop_at, "last_work": f.last_work if f is not None and f.last_work else None,
                 "stopped_at": self.stopped_at, "billed_idle": None, "stop_rc": None, "stop_out": None,
                 "pid": os.getpid()}
        if self.failed is not None:
            state.update(stop_rc=self.failed.get("rc"), stop_out=self.failed.get("out"))
        state.update(extra)
        _write_json(self.state_path, state)
        if self.store is not None:
            self.store.publish([self.state_path])
        if v.kind != self.last_kind and v.kind not in ACTS:  # an act is its own event
            self.event("verdict", now, kind=v.kind, why=v.why)
        self.last_kind = v.kind

    def event(self, ev: str, now: float, **fields: Any) -> None:
        _append(self.events_path, {"t": now, "host": self.host, "ev": ev, **fields})
        if self.store is not None:
            self.store.publish([self.events_path])

    def step(self) -> float:
        """One check (and, when it says so, the stop); the seconds until the next (< 0: it ends)."""
        v, cfg, now, f = self.check()
        if cfg is None:
            self.record(v, None, now)
            return -1.0  # off: the watcher ends
        every = cfg.heartbeat
        if v.kind in ("running", "off"):
            self.failed = None  # work came back (or autostop was cancelled): a later stop tries afresh
        if v.kind == "stop" and self.failed is not None and now < self.failed["next"]:
            v = Verdict("stop_failed", self.failed["why"], self.failed["next"])  # tried; again later
        elif v.kind == "stop" and f is not None:
            # once more, every result verified from scratch, just before the box goes
            try:
                f = self.facts(cfg, self.clock(self.root, self.host), fresh_verify=True)
            except Unsure as e:
                self.record(Verdict("unsure", f"not deciding: {e}"), cfg, now)
                return every
            v = autostop.decide(cfg.settings, f)
            if v.kind == "stop":
                return self.stop(cfg, f)
        if self.failed is not None and v.kind == "stop_failed":
            v = Verdict("stop_failed", self.failed["why"], self.failed["next"])
        self.record(v, cfg, now, f)
        if v.stop_at is not None:
            return max(0.2, min(every, v.stop_at - now + 0.05))
        return every

    def stop(self, cfg: Config, f: Facts) -> float:
        now = self.clock(self.root, self.host)
        billed = max(0.0, now - f.last_work)
        self.stopped_at = now
        why = f"idle {autostop._minutes(billed)} since its last work: stopping (`{cfg.settings.command}`)"
        self.record(Verdict("stopping", why), cfg, now, f, billed_idle=billed)
        self.event("stopping", now, command=cfg.settings.command, billed_idle=billed)
        if self.store is not None and self.store.error:  # the store does not know: not stopping blind
            self.stopped_at = None
            self.record(Verdict("unsure", f"not stopping: the sweep's store did not take its record: "
                                          f"{self.store.error}"), cfg, now, f)
            return cfg.heartbeat
        rc, out = self.run(cfg.settings.command)
        tail = out[-OUT_TAIL:]
        after = self.clock(self.root, self.host)
        if rc == 0:
            self.record(Verdict("stopped", f"stopped itself, {autostop._minutes(billed)} idle billed"), cfg,
                        after, f, billed_idle=billed, stop_rc=0, stop_out=tail)
            self.event("stopped", after, rc=0, out=tail, billed_idle=billed)
            # the instance is expected to go now; if it is still here after SETTLE, it did not
            deadline = time.monotonic() + self.settle
            while time.monotonic() < deadline:
                time.sleep(min(5.0, cfg.heartbeat))
            why = (f"the stop command exited 0 but the instance is still up after {int(self.settle)} s: "
                   "it keeps billing")
        else:
            said = tail.strip()[-200:] or "no output"
            why = f"the stop command failed (exit {rc}): {said}: it keeps billing"
        after = self.clock(self.root, self.host)
        self.stopped_at = None
        self.failed = {"t": after, "rc": rc, "out": tail, "why": why,
                       "next": after + retry_after(cfg.settings.idle)}
        # the event first: whoever reads the state `stop_failed` finds its event there too
        self.event("stop_failed", after, rc=rc, out=tail, why=why)
        self.record(Verdict("stop_failed", why, self.failed["next"]), cfg, after, f, stop_rc=rc,
                    stop_out=tail)
        return cfg.heartbeat

    def loop(self) -> int:
        self.event("watch_start", time.time(), pid=os.getpid())
        while True:
            try:
                wait = self.step()
            except Exception as e:  # the storage went away, or a bug: said where status reads it (the
                # traceback in its log), never a watcher gone silently while its instance bills
                traceback.print_exc()
                what = "the sweep's storage" if isinstance(e, OSError) else f"it failed ({type(e).__name__})"
                with contextlib.suppress(Exception):
                    self.record(Verdict("unsure", f"not deciding: {what}: {e}"), None, time.time())
                wait = 10.0
            if wait < 0:
                return 0
            time.sleep(wait)


def _with(f: Facts, **kw: Any) -> Facts:
    from dataclasses import replace

    return replace(f, **kw)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _tasks(text: str) -> dict[str, int]:
    from ablate.remote.queue import grammar

    return grammar.task_epochs(text)


def run_command(command: str, host: str, hidden: Collection[str] = ()) -> tuple[int, str]:
    """The stop command through `sh -c` in the watcher's environment (the queue's: the profile's env
    activated) without the variables `hidden` (a store's credentials) and with ABLATE_HOST set, its
    output kept (never logged elsewhere: it may name ids)."""
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    try:
        p = subprocess.run(["sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=COMMAND_TIMEOUT, check=False,
                           env={**env, "ABLATE_HOST": host})
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, bytes) else b""
        return 124, out.decode("utf-8", "replace") + f"\n(timed out after {int(COMMAND_TIMEOUT)} s)"
    except OSError as e:
        return 127, str(e)
    return p.returncode, p.stdout.decode("utf-8", "replace")


# ------------------------------------------------------------------ one watcher per sweep and host

def lock_path(root: str, host: str) -> str:
    d = os.path.join(tempfile.gettempdir(), f"ablate-autostop-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    key = hashlib.sha256(f"{root}\0{host}".encode()).hexdigest()[:16]
    return os.path.join(d, f"{key}.lock")


def _try_lock(path: str) -> int | None:
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def ensure(root: str, host: str) -> bool:
    """Start this host's watcher unless it runs (serve calls it as a queue starts). True when one
    was started. Never raises: autostop must not stop a queue from running."""
    try:
        if not os.path.exists(settings_path(root, host)):
            return False
        fd = _try_lock(lock_path(root, host))
        if fd is None:
            return False  # it runs
        os.close(fd)
        entry = sys.argv[0]
        argv = ([sys.executable, entry] if entry.endswith(".pyz")
                else [sys.executable, "-m", "ablate.remote.host.autostop_watch"])
        log = open(os.path.join(_dir(root), f".{host}.watch.log"), "ab")  # noqa: SIM115 (the child's)
        with log:
            subprocess.Popen([*argv, "autostop", root, host], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                             cwd="/")
        return True
    except Exception as e:  # the queue goes on
        print(f"runner: the autostop watcher could not be started: {e}", file=sys.stderr)
        return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["autostop"]:
        args = args[1:]
    if len(args) != 2:
        print("usage: runner autostop ROOT HOST", file=sys.stderr)
        return 2
    root, host = args
    from ablate.remote.queue import grammar

    if not grammar.SAFE_NAME.fullmatch(host):
        print(f"runner autostop: bad host {host!r}", file=sys.stderr)
        return 2
    fd = _try_lock(lock_path(root, host))
    if fd is None:
        return 0  # another watcher runs for this sweep and host
    import signal

    for sig in (signal.SIGHUP, signal.SIGINT):  # detached: only a TERM or KILL ends it
        signal.signal(sig, signal.SIG_IGN)
    try:
        from ablate.remote.host.autostop_store import from_env  # None without ABLATE_STORE

        return Watcher(root, host, store=from_env(root, host)).loop()
    finally:
        os.close(fd)


if __name__ == "__main__":
    raise SystemExit(main())
