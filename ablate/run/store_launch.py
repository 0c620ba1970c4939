"""How a queue starts on a storage host (its profile has `storage:`: the sweep lives in an object
store, and the instance mounts nothing shared): the controller's side. The instance's side is
ablate/remote/store/instance_boot.py.

Deploy has put the wrappers, the runner zipapp and the specs into the store (the usual placement,
through the controller's view of the store). Each launch then runs, over the host's SSH transport,
one program on the instance (with the profile's env active and its `python`; the program's text and
its request on stdin, never in argv: argv shows in `ps`, in tmux's session command and in our error
messages), which fetches the files its queues need (`boot_files`: what DEPLOYED.json names for that
host) into the instance's own copy of the sweep, `<ckpt_root>/.ablate/<sweep>`, each checked against
the sha12 in its name and put in place read-only; then starts the host's queues in tmux, and hands
each one the controller's credentials. A file missing from the store or damaged there refuses the
launch on that host in one line, and nothing is started there; so does a missing boto3 (it names
`pip install boto3` in the profile's env).

Credentials. The controller takes them from the standard AWS chain (`controller_credentials`:
boto3's session, so the environment, ~/.aws, AWS_PROFILE, SSO or a role; with the region when one is
set). They travel only on the SSH stdin of that program, which keeps them in memory and hands them to
each queue through a FIFO. Without credentials here, nothing is passed and the instance's own chain
applies (an instance role, its ~/.aws); launch's progress line says which. Nothing of them is ever
written to the store, a spec, an event, a log, or a file on the instance.

The FIFO contract (the boot program writes, run_queue reads):

- `ABLATE_CREDS_FIFO` is in the queue's process environment only when credentials are passed: the
  path of a FIFO, `<ABLATE_ROOT>/.creds.<16 hex>`, mode 0600, made before the session starts; the
  session's command is `env ABLATE_CREDS_FIFO=<path> bash run_queue.<sha12>.sh SPEC QUEUE K [SLOT]`.
- The writer opens it only once a reader has it open (a non-blocking open for writing, retried),
  writes lines `NAME=VALUE`, each ending in a newline (NAME matching `AWS_[A-Z_]+`: AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN when there is one, AWS_REGION and AWS_DEFAULT_REGION when
  set; VALUE at most 4096 characters, no control character), closes it (the reader's EOF) and
  removes it. A queue that has not opened it within 30 s, or that ends first, has its session killed
  and that queue's launch fails.
- run_queue, at its start, before anything touches the store: when `ABLATE_CREDS_FIFO` names a
  FIFO, reads it to EOF, takes the lines `NAME=VALUE` whose NAME matches `AWS_[A-Z_]+` (any other
  line ignored), exports them to the processes of the queue that reach the store, removes the FIFO
  (`rm -f`) and unsets `ABLATE_CREDS_FIFO`; it never writes the values anywhere.

The data goes through the kernel's pipe buffer, never to a disk.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ablate import resources as packaged
from ablate.config.project import Host, Project
from ablate.errors import AblateError, FSError, RemoteError
from ablate.remote.store.client import Store, StoreError
from ablate.remote.store.instance_boot import BOOTSTRAP, CRED_NAME, NO_BOTO3
from ablate.run.placement import DeployResult
from ablate.transport import HostTransport, SharedFS
from ablate.transport.shellhost import BASH_C

CREDS_FIFO = "ABLATE_CREDS_FIFO"
FIFO_WAIT = 30.0  # seconds a queue has to open its FIFO
STORE_WAIT = 30.0  # seconds an unreachable store is waited out at a launch (a queue waits longer)
PROBE_WAIT = 10.0  # ... at doctor's check of a host
# $1 the profile's env, $2 its python, $3 the loader (`instance_boot.BOOTSTRAP`); the rest comes on stdin
_RUN = ('if [ -n "$1" ]; then eval "$1" >&2 || exit 98; fi\n'
        'command -v -- "$2" >/dev/null 2>&1 || exit 97\n'
        'exec "$2" -c "$3"')
# botocore's own settings a store may need on every client, the queues' too (a store that refuses
# the default trailing checksums of uploads: when_required)
CLIENT_SETTINGS = ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION")
MAX_VALUE = 4096  # characters of one credential's value (run_queue's reader takes no more)
# Made into modules on the instance, in this order: exactly what the boot program imports.
_SHIPPED = ("ablate.remote.store.client", "ablate.remote.host.session_env",
            "ablate.remote.store.instance_boot")


@dataclass(frozen=True)
class BootPlan:
    """What one storage host's boot program needs, besides its queues and the credentials."""

    host: str
    store: str  # the sweep's store URL
    endpoint: str | None
    root: str  # the instance's own copy of the sweep
    files: tuple[str, ...]  # paths relative to the root, content-addressed
    env: str  # the profile's env activation ("" when none)
    python: str


@dataclass(frozen=True)
class Started:
    """One queue's start: `started`, `running` (its session was there already) or `failed` (why)."""

    state: str
    why: str = ""


def boot_files(dep: DeployResult, host: str) -> tuple[str, ...]:
    """The files a launch on `host` runs: its run_queue, run_one, runner zipapp and run spec."""
    names = [f"wrappers/{dep.run_queue}", f"wrappers/{dep.run_one}"]
    if dep.runner:
        names.append(f"wrappers/{dep.runner}")
    return (*names, f"specs/{dep.specs[host]}")


def boot_plan(project: Project, host: Host, dep: DeployResult) -> BootPlan | None:
    """The boot of `host`, or None when it is not a storage host (it mounts the shared FS)."""
    store = project.sweep_store(host)
    if store is None:
        return None
    return BootPlan(host.name, store[0], store[1], project.sweep_root(host), boot_files(dep, host.name),
                    host.profile.env or "", host.profile.python)


def controller_credentials() -> dict[str, str]:
    """The controller's credentials from the standard AWS chain as `AWS_*` variables; {} when it
    has none (the instances' own chain applies then)."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        session = boto3.session.Session()
        found = session.get_credentials()
        frozen = found.get_frozen_credentials() if found is not None else None
        region = session.region_name
    except BotoCoreError as e:  # a named profile that is not there, a credential process that failed
        raise AblateError(f"cannot read this controller's AWS credentials: {e}") from None
    if frozen is None or not frozen.access_key or not frozen.secret_key:
        return {}
    out = {"AWS_ACCESS_KEY_ID": frozen.access_key, "AWS_SECRET_ACCESS_KEY": frozen.secret_key}
    if frozen.token:
        out["AWS_SESSION_TOKEN"] = frozen.token
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", *CLIENT_SETTINGS):
        if os.environ.get(name):
            out[name] = os.environ[name]
    if region and "AWS_DEFAULT_REGION" not in out:
        out["AWS_DEFAULT_REGION"] = region
    return out


def creds_note(creds: Mapping[str, str]) -> str:
    """What launch's progress line says about the credentials a storage host's queues got."""
    if creds:
        return "AWS credentials from this controller's chain, in the queue's environment only"
    return "no AWS credentials on this controller: the instance's own (its role, its ~/.aws) apply"


def upload_configs(project: Project, store: Store, cfgs: Iterable[str]) -> int:
    """The cells' configs as this repo has them, into the store (`cfgs/<cfg>`), for an instance
    whose clone of the repo lacks one (run_one fetches it): only those the store lacks or holds
    other bytes of (one listing, compared by the MD5 a plain PUT's ETag is). The number sent.
    AblateError naming the config and the fix when one is not readable here."""
    want: dict[str, bytes] = {}
    for cfg in sorted(set(cfgs)):
        if cfg.startswith("/") or ".." in cfg.split("/"):
            continue  # outside the repo: the instance's own path
        try:
            want[cfg] = (project.dir / cfg).read_bytes()
        except OSError as e:
            raise AblateError(f"cannot read the config {cfg} in {project.dir} ({e.strerror}); the "
                              f"queue names it: fix the line or add the file") from None
    have = {o.key[len("cfgs/"):]: o.etag for o in store.list("cfgs/")}
    todo = [c for c, data in want.items()
            if have.get(c) != hashlib.md5(data, usedforsecurity=False).hexdigest()]
    with ThreadPoolExecutor(max(1, min(16, len(todo)))) as pool:
        list(pool.map(lambda c: store.put(f"cfgs/{c}", want[c]), todo))
    return len(todo)


def configs_to_store(project: Project, fs: SharedFS, cfgs: Iterable[str]) -> None:
    """`upload_configs` where the sweep is kept in a store (launch, append); nothing for a shared FS,
    where the instances read the repo's workdir. A store's failure is an FSError naming it."""
    store = getattr(fs, "store", None)
    if project.sweep_store() is None or not isinstance(store, Store):
        return
    try:
        upload_configs(project, store, cfgs)
    except StoreError as e:
        raise FSError("store", "sending the cells' configs to", store.where("cfgs/"), str(e)) from e


def boot(ht: HostTransport, plan: BootPlan, queues: Mapping[str, Sequence[str]],
         creds: Mapping[str, str], probe: bool = False) -> dict[str, Started]:
    """Fetch `plan.files` on the host, then start each queue (session name -> run_queue argv) and
    hand it `creds`. Raises RemoteError, naming the host, when nothing was started there (a file
    missing or damaged in the store, no Python, no boto3, the store unreachable)."""
    bad = sorted(k for k, v in creds.items() if not CRED_NAME.match(k) or not _one_line(v))
    if bad:
        raise AblateError(f"refused to hand over {', '.join(bad)}: only AWS_* variables, each value one "
                          f"line of at most {MAX_VALUE} characters")
    request = {"store": plan.store, "endpoint": plan.endpoint, "root": plan.root, "files": list(plan.files),
               "tmux": ht.tmux_argv(), "queues": [{"session": s, "argv": list(a)} for s, a in queues.items()],
               "creds": dict(creds), "wait": FIFO_WAIT, "store_wait": PROBE_WAIT if probe else STORE_WAIT,
               "probe": probe}
    modules = [[name, packaged.module(name).decode()] for name in _SHIPPED]
    stdin = json.dumps({"modules": modules, "request": request}).encode()
    timeout = 60.0 + STORE_WAIT * len(plan.files) + (FIFO_WAIT + 5.0) * len(queues)
    r = ht.run([*BASH_C, _RUN, "bash", plan.env, plan.python, BOOTSTRAP], stdin=stdin, timeout=timeout)
    answer = _answer(r.stdout)
    where = f"{plan.host}: cannot start its queues from the store {plan.store}"
    if r.rc == 97:
        raise RemoteError(scrub(f"{where}: no {plan.python} there (after the profile's env); the launch "
                                f"runs Python 3 with boto3 on the instance", creds))
    if r.rc == 98:
        raise RemoteError(scrub(f"{where}: the profile's env {plan.env!r} failed: "
                                f"{r.stderr.strip()[-300:]!r}", creds))
    if answer is None:
        raise RemoteError(scrub(f"{where}: the boot program exited {r.rc} without an answer: "
                                f"{(r.stderr.strip() or r.stdout.strip())[-300:]!r}", creds))
    if answer.get("error"):
        after = "" if r.rc == NO_BOTO3 else "; nothing was started there"
        raise RemoteError(scrub(f"{where}: {answer['error']}{after}", creds))
    got = answer.get("queues")
    out: dict[str, Started] = {}
    for session in queues:
        one = got.get(session) if isinstance(got, dict) else None
        if not isinstance(one, dict) or one.get("state") not in ("started", "running", "failed"):
            out[session] = Started("failed", f"no answer for session {session}")
        else:
            out[session] = Started(str(one["state"]), scrub(str(one.get("why") or ""), creds))
    return out


def _answer(stdout: str) -> dict[str, object] | None:
    """The program's one JSON object: its last line of stdout that parses as one."""
    for line in reversed(stdout.splitlines()):
        try:
            got = json.loads(line)
        except ValueError:
            continue
        if isinstance(got, dict):
            return got
    return None


def _one_line(value: str) -> bool:
    return len(value) <= MAX_VALUE and not any(ord(c) < 32 or ord(c) == 127 for c in value)


def scrub(text: str, creds: Mapping[str, str]) -> str:
    """`text` with any credential's value blotted out: an error message never carries one."""
    for name, value in creds.items():
        if value and name not in ("AWS_REGION", "AWS_DEFAULT_REGION", *CLIENT_SETTINGS):
            text = text.replace(value, "***")
    return text
