"""A small real trainer for the fault suite (tests/test_faults_*.py); it runs on the test-bed
instances from the sweep's shared workdir, so it imports only numpy, safetensors and yaml.

    python fault_train.py --config CFG --epochs N --out CKPT_DIR --resume 0|1 --name NAME

Fits a linear model by gradient descent. After every epoch it replaces `model.safetensors` in the
out dir atomically (tmp + rename: a kill never leaves half a checkpoint), prints `epoch k/N
val_loss=…` and appends `{"ev": "epoch", "epoch": k, "pid": …}` to `trace.jsonl` there: the
trainer's own record of what it did, which survives a reboot with the instance-local disk. With
`--resume 1` it continues from the checkpoint's epoch (a `{"ev": "start", "start_epoch": …}` trace
line says where each run began). At the end: `metrics.json` with `val_loss`, `train_loss`,
`epochs`, `start_epoch`.

Faults are switched on per cell by marker files in `faults/` under the working directory (the
shared workdir, so the test can add and remove them while the sweep runs):
  faults/<name>.oom   after epoch 1: SIGKILL itself — exit 137, no trace, as a container's OOM
                      killer leaves it;
  faults/<name>.hang  after epoch N (the file's content, default 1): sleep with the log silent
                      for as long as the marker exists (a stuck dataloader; the test also uses it
                      to hold a cell mid-way, deterministically, on a loaded machine);
  faults/<name>.stall  before epoch N+1 (the file's content, default 0), also in a resumed run:
                      sleep, silent, for as long as the marker exists (a run that never reaches its
                      next save: its checkpoint stays what it was);
  faults/<name>.save_on_term  on SIGTERM: trace `{"ev": "term"}`, take S seconds (the file's
                      content) to "save" a large checkpoint, trace `{"ev": "saved", "told":
                      <ABLATE_STOP_FILE's record or null>}`, exit 143. Without it TERM kills at once.
Config keys: lr, hidden, seed, step_time (seconds of sleep per epoch).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import numpy as np
import yaml
from safetensors.numpy import load_file, save_file

CKPT = "model.safetensors"


def _trace(out: str, **rec: object) -> None:
    with open(os.path.join(out, "trace.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"t": time.time(), "pid": os.getpid(), **rec}) + "\n")


def _fault(name: str, kind: str) -> str | None:
    """The marker's content when `faults/<name>.<kind>` exists, else None (also when the shared FS
    does not answer: an outage of its server is a fault the suite injects too)."""
    try:
        with open(os.path.join("faults", f"{name}.{kind}"), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _hangs(name: str, epoch: int) -> bool:
    after = _fault(name, "hang")
    return after is not None and epoch >= int(after or 1)


def _stalls(name: str, done: int) -> bool:
    after = _fault(name, "stall")
    return after is not None and done >= int(after or 0)


def _save_on_term(out: str, seconds: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # saving: a second TERM changes nothing
    _trace(out, ev="term")
    time.sleep(seconds)
    try:  # why it was stopped (a TERM from Slurm itself may come a moment before the record)
        with open(os.environ.get("ABLATE_STOP_FILE", ""), encoding="utf-8") as f:
            told = json.load(f)
    except (OSError, ValueError):
        told = None
    _trace(out, ev="saved", told=told)
    sys.exit(143)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", type=int, default=0)
    ap.add_argument("--name", required=True)
    args = ap.parse_args(argv)
    with open(args.config, encoding="utf-8") as f:
        cfg = yaml.safe_load(f) or {}
    lr, n_feat = float(cfg.get("lr", 0.1)), int(cfg.get("hidden", 8))
    step_time = float(cfg.get("step_time", 0.0))

    rng = np.random.default_rng(int(cfg.get("seed", 0)))
    true_w = rng.normal(size=n_feat).astype(np.float32)
    x = rng.normal(size=(256, n_feat)).astype(np.float32)
    y = x @ true_w + 0.1 * rng.normal(size=256).astype(np.float32)
    x_tr, y_tr, x_va, y_va = x[:200], y[:200], x[200:], y[200:]

    os.makedirs(args.out, exist_ok=True)
    ckpt = os.path.join(args.out, CKPT)
    w, start = np.zeros(n_feat, dtype=np.float32), 0
    if args.resume and os.path.exists(ckpt):
        state = load_file(ckpt)
        w, start = state["w"], int(state["epoch"][0])
        print(f"resumed from epoch {start}", flush=True)
    _trace(args.out, ev="start", resume=args.resume, start_epoch=start)
    save = _fault(args.name, "save_on_term")
    if save is not None:
        signal.signal(signal.SIGTERM, lambda *_: _save_on_term(args.out, float(save or 10)))
    stall = _fault(args.name, "stall")  # read once per run: an outage of the FS must not slow epochs
    for epoch in range(start, args.epochs):
        while stall is not None and _stalls(args.name, epoch):
            time.sleep(0.1)
        grad = 2 * x_tr.T @ (x_tr @ w - y_tr) / len(y_tr)
        w = (w - lr * grad).astype(np.float32)
        val = float(np.mean((x_va @ w - y_va) ** 2))
        save_file({"w": w, "epoch": np.array([epoch + 1], dtype=np.int64)}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
        _trace(args.out, ev="epoch", epoch=epoch + 1)
        print(f"epoch {epoch + 1}/{args.epochs} val_loss={val:.5f}", flush=True)
        if _fault(args.name, "oom") is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        while _hangs(args.name, epoch + 1):
            time.sleep(0.1)
        if step_time:
            time.sleep(step_time)
    metrics = {"val_loss": float(np.mean((x_va @ w - y_va) ** 2)),
               "train_loss": float(np.mean((x_tr @ w - y_tr) ** 2)),
               "epochs": args.epochs, "start_epoch": start}
    with open(os.path.join(args.out, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
