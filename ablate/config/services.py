"""`services:` in ablate.yaml: processes that run beside the trainer (an inference server for RL).

    services:
      - name: vllm
        command: python -m vllm.entrypoints.openai.api_server --port {port} --model m
        gpus: 1                    # GPU slots it takes from each queue's share of the host
        port: 8000                 # a base: the k-th queue on a host gets port + k
        ready: {http: "http://127.0.0.1:{port}/health", timeout: 300}   # or {cmd: ..., timeout: ...}
        scope: queue               # started once before the queue's first cell; `cell`: around each

Each queue on a host takes 1 + sum(gpus) of the host's GPUs: the first is the trainer's slot (its
`CUDA_VISIBLE_DEVICES`), the next ones each service's, in the order listed. A host's queues are
numbered k = 0, 1, ... by their slot, and each service instance listens on `port + k`. The train
template gets `{port}` (the first service's port) and `{port_<name>}` for every service.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from ablate.config.reader import Reader, check_template, tname
from ablate.config.settings import parse_duration

SCOPES = ("queue", "cell")
SERVICE_FIELDS = {"port", "gpu", "name"}
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")  # also a bash variable-name part and a JSON key
_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]+|:\{port\})?(/[A-Za-z0-9._~/?&=%+,:@{}-]*)?$")


@dataclass(frozen=True)
class Service:
    name: str
    command: str
    gpus: int
    port: int
    ready_http: str | None
    ready_cmd: str | None
    timeout: float  # seconds to become ready
    scope: str  # queue | cell

    def port_for(self, k: int) -> int:
        return self.port + k


def gpus_per_queue(services: tuple[Service, ...]) -> int:
    return 1 + sum(s.gpus for s in services)


def train_fields(services: tuple[Service, ...]) -> set[str]:
    """The train template's extra fields: {port} (the first service's) and {port_<name>}."""
    return ({"port"} if services else set()) | {f"port_{s.name}" for s in services}


def _ready(s: Reader) -> tuple[str | None, str | None, float]:
    raw = s.data.get("ready")
    if not isinstance(raw, dict):
        raise s.err("ready", f"must be {{http: URL, timeout: SECONDS}} or {{cmd: COMMAND, timeout: "
                             f"SECONDS}}, got {tname(raw)}")
    r = s.sub("ready", {"http", "cmd", "timeout"})
    http, cmd = r.text("http"), r.text("cmd")
    if (http is None) == (cmd is None):
        raise r.err("http", "give exactly one of http (a URL answering 2xx when ready) or cmd "
                            "(a command exiting 0 when ready)")
    if http is not None and not _URL.match(http):
        raise r.err("http", f"{http!r} must be a plain http(s) URL such as "
                            "http://127.0.0.1:{port}/health")
    if http is not None:
        check_template(http, SERVICE_FIELDS, r, "http")
    if cmd is not None:
        if "\n" in cmd:
            raise r.err("cmd", "spans several lines; write one command")
        check_template(cmd, SERVICE_FIELDS, r, "cmd")
    where = f"{r.file}: {r._k('timeout')}"
    timeout = parse_duration(r.data["timeout"], where) if r.has("timeout") else 300.0
    if timeout <= 0:
        raise r.err("timeout", f"must be a positive duration, got {r.data.get('timeout')!r}")
    return http, cmd, timeout


def parse_services(r: Reader) -> tuple[Service, ...]:
    raw: Any = r.data.get("services") or []
    if not isinstance(raw, list):
        raise r.err("services", f"must be a list of {{name, command, port, ready, gpus, scope}}, "
                                f"got {tname(raw)}")
    out: list[Service] = []
    for i, item in enumerate(raw):
        s = Reader(item, r.file, f"services[{i}]", {"name", "command", "gpus", "port", "ready", "scope"})
        name = s.text("name", required=True) or ""
        if not _NAME.match(name):
            raise s.err("name", f"{name!r} must be lower-case letters, digits and _ (a letter first, "
                                "at most 32)")
        if any(o.name == name for o in out):
            raise s.err("name", f"{name!r} names two services")
        command = (s.text("command", required=True) or "").strip()
        if "\n" in command:
            raise s.err("command", "spans several lines; write one command "
                                   "(YAML `>-` folds a long one onto one line)")
        check_template(command, SERVICE_FIELDS, s, "command")
        gpus = s.data.get("gpus", 0)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= 16:
            raise s.err("gpus", f"must be how many GPU slots it takes (0 to 16), got {gpus!r}")
        port = s.whole("port", required=True)
        if port is None or not 1024 <= port <= 65000:
            raise s.err("port", f"must be a TCP port from 1024 to 65000 (a base: queue k uses port + k), "
                                f"got {s.data.get('port')!r}")
        scope = s.text("scope", "queue") or "queue"
        if scope not in SCOPES:
            raise s.err("scope", f"must be queue (started once per queue) or cell (around each cell), "
                                 f"got {scope!r}")
        http, cmd, timeout = _ready(s)
        out.append(Service(name, command, gpus, port, http, cmd, timeout, scope))
    ports = sorted((s.port, s.name) for s in out)
    for (p1, n1), (p2, n2) in itertools.pairwise(ports):
        if p2 - p1 < 16:
            raise r.err("services", f"ports of {n1} ({p1}) and {n2} ({p2}) are closer than 16: queue k "
                                    "of a host uses port + k; space the bases apart")
    return tuple(out)
