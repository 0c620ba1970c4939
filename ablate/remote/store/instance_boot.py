"""The instance's side of a launch on a storage host (its profile has `storage:`; the controller's
side, and the contract of the credentials' FIFO, are in ablate/run/store_launch.py).

The controller runs this program on the instance with the profile's env active and its `python`;
the program's text, the `ablate.remote.store.client` module it uses and the request all come on stdin
as one JSON document (`BOOTSTRAP` reads it), never on the command line, which `ps` shows. It

1. fetches each file the queues need from the store into the instance's own copy of the sweep
   (`<root>/wrappers/run_queue.<sha12>.sh`, ...): a file already there whose sha256 starts with the
   sha12 in its name is kept; otherwise the store's bytes are checked against that address, then put
   in place read-only (0444) by a temp file and a rename. A file missing from the store, or whose
   bytes are not its address, refuses the launch: nothing is started;
2. starts each queue's tmux session (`tmux new-session -d -s SESSION COMMAND`);
3. with credentials, hands them to each queue through a FIFO of its own, `<root>/.creds.<random>`
   (mode 0600): the session's command is `env ABLATE_CREDS_FIFO=<fifo> <argv...>`, the FIFO is opened
   for writing once the queue has opened it for reading (non-blocking opens retried until `wait`
   seconds), `NAME=VALUE` lines are written, and it is closed and removed. A queue that does not
   read it within `wait` seconds (or ends first) has its session killed and counts as failed.

The credentials are in this process's memory only: they are put into its environment just for the
moment the store's client is built (boto3 reads them there) and taken out again before any tmux
runs, so no tmux server or session inherits them. The answer is one JSON object on stdout:
`{"error", "fetched", "kept", "queues": {session: {"state": started|running|failed, "why"}}}`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ablate.remote.host import session_env

# Run by `python -c BOOTSTRAP` with {"modules": [[name, source], ...], "request": {...}} on stdin:
# each module made from its source (this one last), then `main(request)`.
BOOTSTRAP = (
    "import json, sys, types\n"
    "d = json.loads(sys.stdin.buffer.read())\n"
    "for n, src in d['modules']:\n"
    "    for i in range(1, n.count('.') + 1):\n"
    "        p = types.ModuleType(n.rsplit('.', i)[0]); p.__path__ = []\n"
    "        sys.modules.setdefault(p.__name__, p)\n"
    "    m = types.ModuleType(n); sys.modules[n] = m; exec(compile(src, '<' + n + '>', 'exec'), m.__dict__)\n"
    "raise SystemExit(sys.modules['ablate.remote.store.instance_boot'].main(d['request']))\n"
)
CRED_NAME = re.compile(r"^AWS_[A-Z_]+$")
FETCHED = re.compile(r"^(wrappers|specs)/[A-Za-z0-9._-]+$")
NO_BOTO3 = 3  # the exit code when boto3 is missing (the answer says so too)


def main(req: Mapping[str, Any]) -> int:
    answer: dict[str, Any] = {"error": None, "fetched": [], "kept": [], "queues": {}}
    try:
        import boto3  # noqa: F401  (what the store needs: said here in one line, not as a traceback)
    except ImportError as e:
        answer["error"] = (f"boto3 is not installed for {sys.executable} ({e}): `pip install boto3` in the "
                           f"profile's env")
        _say(answer)
        return NO_BOTO3
    creds = {str(k): str(v) for k, v in (req.get("creds") or {}).items()}
    bad = [k for k, v in creds.items() if not CRED_NAME.match(k) or "\n" in v or "\0" in v]
    if bad:
        answer["error"] = (f"refused credential names {', '.join(sorted(bad))}: only AWS_* names, "
                           f"one line each")
        _say(answer)
        return 2
    root = str(req["root"])
    try:
        store = _store(str(req["store"]), req.get("endpoint"), creds, float(req.get("store_wait", 30)))
        if req.get("probe"):  # doctor: one question, with what a queue would have
            store.head("DEPLOYED.json")
        for rel in req["files"]:
            kept = fetch(store, root, str(rel))
            answer["kept" if kept else "fetched"].append(rel)
    except Exception as e:  # StoreError, OSError, a refused file: nothing is started
        answer["error"] = str(e) or type(e).__name__
        _say(answer)
        return 0
    lines = "".join(f"{k}={v}\n" for k, v in sorted(creds.items())).encode()
    tmux = [str(a) for a in req["tmux"]]
    for q in req["queues"]:
        state, why = start(tmux, root, str(q["session"]), [str(a) for a in q["argv"]], lines,
                           float(req.get("wait", 30)))
        answer["queues"][q["session"]] = {"state": state, "why": why}
    _say(answer)
    return 0


def _say(answer: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def _store(url: str, endpoint: object, creds: Mapping[str, str], wait: float) -> Any:
    """The store's client, built with `creds` in the environment only while boto3 reads them."""
    from ablate.remote.store.client import Store

    saved = {k: os.environ.get(k) for k in creds}
    os.environ.update(creds)
    try:
        return Store(url, str(endpoint) if endpoint else None, wait=wait, attempts=3)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def address(rel: str) -> str:
    """The sha12 a deployed file's name carries: `run_queue.<sha12>.sh`, `runner.<sha12>.pyz`,
    `<sha12>.env`. ValueError when it has none."""
    base = rel.rsplit("/", 1)[-1]
    parts = base.split(".")
    sha = parts[-2] if len(parts) >= 3 else parts[0]
    if not re.match(r"^[0-9a-f]{12}$", sha) or not FETCHED.match(rel):
        raise ValueError(f"{rel}: not a content-addressed file of a deploy")
    return sha


def fetch(store: Any, root: str, rel: str) -> bool:
    """`rel` in place under `root`, checked against its address: True when it was there already."""
    sha = address(rel)
    path = os.path.join(root, rel)
    try:
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest().startswith(sha):
                return True
    except FileNotFoundError:
        pass
    got = store.get(rel)
    if got is None:
        raise ValueError(f"{store.where(rel)} is not in the store: deploy again (`ablate deploy`)")
    have = hashlib.sha256(got.data).hexdigest()
    if not have.startswith(sha):
        raise ValueError(f"{store.where(rel)} has sha256 {have[:12]}, not the {sha} its name says: the "
                         f"store's copy is damaged; deploy again (`ablate deploy`)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.boot.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(got.data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o444)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return False


def start(tmux: Sequence[str], root: str, session: str, argv: Sequence[str], creds: bytes,
          wait: float) -> tuple[str, str]:
    """One queue's session, and its credentials handed over when there are any: (state, why)."""
    fifo = None
    if creds:
        fifo = os.path.join(root, f".creds.{secrets.token_hex(8)}")
        os.mkfifo(fifo, 0o600)
        argv = ["env", f"ABLATE_CREDS_FIFO={fifo}", *argv]
    name = session_env.new_name(session)
    try:
        # The queue runs in this program's environment (the connection's), not the tmux server's;
        # the credentials handed over go to its runner alone, through the FIFO, whatever else has them.
        handed = {ln.split(b"=", 1)[0] for ln in creds.splitlines()}
        try:
            env_file = session_env.write_here(name, {k: v for k, v in os.environb.items() if k not in handed})
        except OSError as e:
            return "failed", f"cannot save the environment for session {session}: {e}"
        command = session_env.session_command(name, argv)
        p = subprocess.run([*tmux, "new-session", "-d", "-s", session, command],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        out = (p.stdout + p.stderr).strip()
        if p.returncode != 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(env_file)
            if "duplicate session" in out:
                return "running", ""
            return "failed", f"tmux could not start session {session}: {out[-300:]!r}"
        if fifo is None:
            return "started", ""
        why = hand_over(fifo, creds, wait, lambda: _alive(tmux, session))
        if why is None:
            return "started", ""
        subprocess.run([*tmux, "kill-session", "-t", session], stdin=subprocess.DEVNULL,
                       capture_output=True, check=False)
        return "failed", f"session {session} did not take its credentials: {why}; it was stopped"
    finally:
        if fifo is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fifo)


def _alive(tmux: Sequence[str], session: str) -> bool:
    p = subprocess.run([*tmux, "has-session", "-t", f"={session}"], stdin=subprocess.DEVNULL,
                       capture_output=True, check=False)
    return p.returncode == 0


def hand_over(fifo: str, data: bytes, wait: float, alive: Callable[[], bool]) -> str | None:
    """`data` through `fifo` once a reader has it open: None, or why not (no reader within `wait`
    seconds, or `alive()` says the reader is gone)."""
    deadline = time.monotonic() + wait
    asked = time.monotonic()
    while True:
        try:  # a non-blocking open for writing fails (ENXIO) until a reader has opened it
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            if e.errno != errno.ENXIO:
                return f"cannot open its FIFO: {e.strerror}"
        now = time.monotonic()
        if now > deadline:
            return f"no reader opened its FIFO within {wait:.0f} s"
        if now - asked >= 1.0:
            asked = now
            if not alive():
                return "its queue ended before it read its FIFO"
        time.sleep(0.02)
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as e:
        return f"writing its FIFO failed: {e.strerror}"
    finally:
        os.close(fd)
    return None
