"""Instances of a sweep kept in an object store, on this machine: each its own copy of what launch
fetches from the store, run_queue started with its credentials over a FIFO as at launch."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from ablate.remote.store.client import Store
from tests.helpers.project import LocalProject
from tests.helpers.s3 import CREDS

SECRET = "ablate-sentinel-" + uuid.uuid4().hex  # the secret key's value: must be written nowhere


def instance(lp: LocalProject, root: Path, host: str, url: str, endpoint: str,
             workdir: Path | None = None) -> tuple[Path, Path]:
    """An instance's own copy of what launch fetches from the store (the wrappers and its spec),
    its spec naming the store: (run_queue, spec)."""
    deployed = json.loads((lp.shared / "DEPLOYED.json").read_text())
    (root / "wrappers").mkdir(parents=True)
    (root / "specs").mkdir()
    for name in (deployed["run_queue"], deployed["run_one"], deployed["runner"]):
        (root / "wrappers" / name).write_bytes((lp.shared / "wrappers" / name).read_bytes())
    spec = (lp.shared / "specs" / deployed["specs"][host]).read_text().replace(str(lp.shared), str(root))
    spec += f"ABLATE_STORE={url}\nABLATE_STORE_ENDPOINT={endpoint}\n"
    if workdir is not None:
        spec += f"ABLATE_WORKDIR={workdir}\n"
    (root / "specs" / "spec.env").write_text(spec)
    return root / "wrappers" / deployed["run_queue"], root / "specs" / "spec.env"


def start(run_queue: Path, spec: Path, queue: str, root: Path) -> subprocess.Popen[bytes]:
    """run_queue with no AWS credentials in its environment: they come over a FIFO, as at launch."""
    fifo = root / f".creds.{uuid.uuid4().hex[:8]}"
    os.mkfifo(fifo, 0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["ABLATE_CREDS_FIFO"] = str(fifo)
    p = subprocess.Popen(["bash", str(run_queue), str(spec), queue, "0"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    creds = {**CREDS, "AWS_SECRET_ACCESS_KEY": SECRET}
    with open(fifo, "w") as f:  # blocks until run_queue opens it
        f.write("".join(f"{k}={v}\n" for k, v in creds.items()))
    return p


def store_events(st: Store) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for o in st.list("events/"):
        got = st.get(o.key)
        assert got is not None
        out[o.key] = [json.loads(x) for x in got.data.decode().splitlines()]
    return out
