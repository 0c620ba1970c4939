"""Stdlib-only operations that read many files on the shared FS and answer with one JSON document.

Locally they run in-process; over SSH this module (with `ablate/verify.py`) is what a live host
that mounts the FS runs, so a command costs one round trip, never one per file or per cell.
Usage on a host: `python3 probe.py OP JSON_ARGS` prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def fs_now(root: str) -> float:
    """The FS's own clock: touch a probe file and read its mtime (hosts' clocks disagree)."""
    path = os.path.join(root, ".clock")
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


def snapshot(args: dict[str, Any]) -> dict[str, Any]:
    """Everything `status` needs from the FS in one read: events, heartbeats, claims, results."""
    root = args["root"]
    now = fs_now(root) if args.get("touch", True) else time.time()
    events = {}
    for fn in _listdir(os.path.join(root, "events")):
        if fn.endswith(".jsonl"):
            events[fn[: -len(".jsonl")]] = _read_jsonl(os.path.join(root, "events", fn))
    heartbeats = {}
    for fn in _listdir(os.path.join(root, "heartbeats")):
        if fn.startswith("."):
            continue
        path = os.path.join(root, "heartbeats", fn)
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        heartbeats[fn] = {"mtime": mtime, "data": _read_json(path)}
    claims = {}
    for name in _listdir(os.path.join(root, "claims")):
        try:
            with open(os.path.join(root, "claims", name, "owner"), encoding="utf-8") as f:
                claims[name] = f.read().strip()
        except OSError:
            claims[name] = ""
    final_dir = os.path.join(root, "final_ckpts")
    final = [n for n in _listdir(final_dir)
             if not n.startswith(".") and os.path.exists(os.path.join(final_dir, n, "MANIFEST.json"))]
    ledgers = {}
    queues = {}
    for fn in _listdir(os.path.join(root, "queues")):
        path = os.path.join(root, "queues", fn)
        if fn.endswith(".ledger"):
            ledgers[fn[: -len(".ledger")]] = _read_jsonl(path)
        elif fn.endswith(".txt") and not fn.startswith("."):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    queues[fn[: -len(".txt")]] = f.read()
            except OSError:
                pass
    return {"now": now, "events": events, "heartbeats": heartbeats, "claims": claims,
            "final": final, "ledgers": ledgers, "queues": queues}


def verify(args: dict[str, Any]) -> dict[str, Any]:
    from ablate import verify as v  # stdlib-only at import

    return v.verify_tree(args)


def now(args: dict[str, Any]) -> dict[str, Any]:
    return {"now": fs_now(args["root"])}


OPS = {"snapshot": snapshot, "verify": verify, "now": now}


def run(op: str, args: dict[str, Any]) -> Any:
    if op not in OPS:
        raise ValueError(f"unknown probe op {op!r}")
    return OPS[op](args)


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], json.loads(sys.argv[2]))))
