#!/usr/bin/env python3
"""What a sweep kept in an object store asks of it, counted at the wire, and what that costs.

A real S3 endpoint (moto's server) behind a counting HTTP proxy (tests/helpers/s3.py `FaultProxy`),
a throw-away local project deployed by `ablate.run.deploy.deploy`, and real run_queue processes on
"instances" that share no directory (each its own copy of the sweep, as a storage host's launch
leaves it), their credentials over the launch's FIFO:

- per cell: one queue runs N tiny cells; the requests it made (claims, pulls, events, heartbeats,
  uploads, commits), divided by N;
- per queue-hour: one queue runs one cell that sleeps S seconds with `heartbeat_secs` H; the
  requests made while it trained, scaled to an hour;
- per controller command: `ablate status` and `ablate reconcile` on the finished sweep, through the
  controller's store-backed FS (when this ablate has it).

The dollar figures use AWS S3 Standard's list prices in us-east-1 (PUT, COPY, POST, LIST: $0.005
per 1,000; GET and all other requests: $0.0004 per 1,000; DELETE free) for a 1,000-cell sweep of
1-hour cells on 10 queues, watched all along by `status --watch` (which lists the store at most every
`storefs.POLL` seconds).

    python3 scripts/bench_store_requests.py [--cells 20] [--hold 20] [--heartbeat 5] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import measured_line, publish, write_project

from ablate.config.project import load_project
from ablate.remote.store.client import Store
from ablate.run.deploy import deploy
from tests.helpers.s3 import CREDS, FaultProxy, moto_s3

PRICE = {"PUT": 0.005 / 1000, "LIST": 0.005 / 1000, "GET": 0.0004 / 1000, "HEAD": 0.0004 / 1000,
         "DELETE": 0.0}


def project(base: Path, n: int, hb: int, sleep: float) -> Path:
    return write_project(
        base / "proj", "bench",
        train=f"sleep {sleep} && mkdir -p {{ckpt_dir}} && cat {{cfg}} > {{ckpt_dir}}/m.bin",
        artifacts={"checkpoint": "m.bin"}, tasks={"t": {"epochs": 1, "cost_per_epoch": 1.0}},
        configs={f"c{i}": yaml.safe_dump({"seed": i}) for i in range(n)},
        queues={"q1": [f"configs/c{i}.yaml t 1" for i in range(n)]},
        budget={"ckpt_size": "1MB", "scratch": "1MB"}, heartbeat_secs=hb, hosts={"h1": {"speed": 1.0}})


def run_queue(proj: Path, inst: Path, url: str, endpoint: str) -> None:
    """The deployed wrappers copied to the instance's own disk, its spec naming the store, run to
    the queue's end with its credentials over a FIFO."""
    p = load_project(proj)
    root = Path(p.sweep_root())
    deployed = json.loads((root / "DEPLOYED.json").read_text())
    (inst / "wrappers").mkdir(parents=True)
    (inst / "specs").mkdir()
    for name in (deployed["run_queue"], deployed["run_one"], deployed["runner"]):
        (inst / "wrappers" / name).write_bytes((root / "wrappers" / name).read_bytes())
    spec = (root / "specs" / deployed["specs"]["h1"]).read_text().replace(str(root), str(inst))
    spec += f"ABLATE_STORE={url}\nABLATE_STORE_ENDPOINT={endpoint}\n"
    (inst / "specs" / "s.env").write_text(spec)
    fifo = inst / ".creds"
    os.mkfifo(fifo, 0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["ABLATE_CREDS_FIFO"] = str(fifo)
    proc = subprocess.Popen(["bash", str(inst / "wrappers" / deployed["run_queue"]),
                             str(inst / "specs" / "s.env"), "q1", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    with open(fifo, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in CREDS.items()))
    out, _ = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"run_queue exited {proc.returncode}:\n{out.decode(errors='replace')[-2000:]}")


def measure(n: int, hb: int, sleep: float, controller: bool = False) -> dict[str, dict[str, int]]:
    """Requests by kind for one queue of `n` cells each sleeping `sleep` s ("queue"); with
    `controller`, then what the controller's reads of the finished sweep ask: a status's snapshot
    from a cold local copy, again with nothing changed, and `reconcile --fs`'s (every result's files)."""
    out: dict[str, dict[str, int]] = {}
    with moto_s3() as s3, tempfile.TemporaryDirectory() as tmp:
        proxy = FaultProxy(s3.endpoint)
        base = Path(tmp)
        proj = project(base, n, hb, sleep)
        deploy(load_project(proj))
        url = s3.url(f"b/{uuid.uuid4().hex[:8]}/ablate/bench")
        st = Store(url, s3.endpoint)  # not through the proxy: the set-up is launch's, not counted
        st.put("queues/q1.txt", (proj / "queues" / "q1.txt").read_bytes())
        run_queue(proj, base / "inst", url, proxy.endpoint)
        out["queue"] = dict(proxy.counts)
        if controller:
            from ablate.transport.storefs import StoreFS

            fs = StoreFS(url, proxy.endpoint, copy=str(base / "controller-copy"))
            for what, op, args in (("status, cold copy", "snapshot", {}),
                                   ("status, nothing new", "snapshot", {}),
                                   ("reconcile --fs", "verify", {"dir": f"{url}/final_ckpts",
                                                                 "names": [f"c{i}" for i in range(n)]})):
                proxy.counts.clear()
                fs.probe(op, {"root": fs.root, "touch": True, **args})
                out[what] = dict(proxy.counts)
        proxy.close()
    return out


def dollars(counts: dict[str, float]) -> float:
    return sum(PRICE.get(k, 0.0004 / 1000) * v for k, v in counts.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--hold", type=float, default=20.0, help="seconds the queue-hour cell trains")
    ap.add_argument("--heartbeat", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    os.environ.update(CREDS)

    # The three runs side by side (each its own store, proxy and sweep: requests are counted per
    # proxy), so the held cell's seconds are not added to the others'.
    with ThreadPoolExecutor(3) as pool:
        runs = [pool.submit(measure, a.cells, 30, 0, True), pool.submit(measure, 1, a.heartbeat, 0),
                pool.submit(measure, 1, a.heartbeat, a.hold)]
        got, one_run, held_run = (r.result() for r in runs)
    per_cell = {k: v / a.cells for k, v in got["queue"].items()}
    one, held = one_run["queue"], held_run["queue"]
    # the difference between one cell held for `hold` s and one that did not train: the training's
    per_hour = {k: max(0.0, held.get(k, 0) - one.get(k, 0)) * 3600 / a.hold for k in set(held) | set(one)}
    kinds = ("PUT", "GET", "HEAD", "LIST", "DELETE")

    cells, queues, hours = 1000, 10, 1.0
    sweep_hours = cells * hours  # queue-hours: each cell one hour on its queue
    hb_scale = a.heartbeat / 30  # at the default heartbeat_secs 30, beats are fewer
    watch_hours = sweep_hours / queues  # the sweep's wall time, watched all along
    from ablate.transport.storefs import POLL

    refreshes = watch_hours * 3600 / POLL  # `status --watch`: the store listed every POLL s
    warm = got["status, nothing new"]
    total = {k: per_cell.get(k, 0) * cells + per_hour.get(k, 0) * sweep_hours * hb_scale
             + warm.get(k, 0) * refreshes for k in kinds}
    ctl_rows = [f"| controller: {what} ({a.cells} cells) | " + " | ".join(str(c.get(k, 0)) for k in kinds)
                + f" | {dollars(c):.6f} |" for what, c in got.items() if what != "queue"]
    lines = [
        "## Object store: requests and their cost",
        "",
        measured_line("python3 scripts/bench_store_requests.py"),
        "",
        f"Counted at the wire (a counting proxy in front of moto's S3 server), one queue on an instance "
        f"with its own disk: {a.cells} tiny cells for the per-cell figures; one cell trained "
        f"{a.hold:.0f} s with heartbeat_secs {a.heartbeat} against one that did not train, scaled to "
        f"an hour, for the queue-hour.",
        "",
        "| requests | " + " | ".join(kinds) + " | $ at AWS list prices |",
        "|---|" + "---|" * (len(kinds) + 1),
        "| per cell (claim, pulls, events, upload, commit) | "
        + " | ".join(f"{per_cell.get(k, 0):.1f}" for k in kinds) + f" | {dollars(per_cell):.6f} |",
        f"| per queue-hour while a cell trains (heartbeat_secs {a.heartbeat}) | "
        + " | ".join(f"{per_hour.get(k, 0):.0f}" for k in kinds) + f" | {dollars(per_hour):.5f} |",
        *ctl_rows,
        f"| a sweep of {cells} one-hour cells on {queues} queues (heartbeat_secs 30), watched by "
        f"`status --watch` for its {watch_hours:.0f} hours (the store listed every {POLL:.0f} s) | "
        + " | ".join(f"{total[k]:.0f}" for k in kinds) + f" | **{dollars(total):.2f}** |",
        "",
        "Prices: S3 Standard, us-east-1: PUT, COPY, POST, LIST $0.005 per 1,000 requests; GET, HEAD "
        "$0.0004 per 1,000; DELETE free. Storage of the results and transfer out to the controller "
        "(`ablate pull`) are the same as on any bucket and not counted here.",
    ]
    publish("bench-store-requests", lines, not a.no_write)


if __name__ == "__main__":
    main()
