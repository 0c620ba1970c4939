"""A tiny but real trainer for `ablate demo` and the tests.

Fits a small linear model to generated data with numpy gradient descent, saves a real
safetensors checkpoint and a metrics JSON. Config (YAML or JSON) keys: lr, hidden (feature count),
seed, noise, step_time (seconds to sleep per epoch, to make progress visible), exit_code (to
simulate a crash). Resumes from its last checkpoint when --resume 1 and one exists.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import yaml
from safetensors.numpy import load_file, save_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", type=int, default=0)
    args = ap.parse_args(argv)

    with open(args.config, encoding="utf-8") as f:
        cfg = yaml.safe_load(f) or {}
    lr = float(cfg.get("lr", 0.1))  # a broken config (lr: "fast") fails here, as in real life
    n_feat = int(cfg.get("hidden", 8))
    step_time = float(cfg.get("step_time", 0.0))
    if cfg.get("exit_code"):
        print(f"simulated failure exit {cfg['exit_code']}", flush=True)
        return int(cfg["exit_code"])

    rng = np.random.default_rng(int(cfg.get("seed", 0)))
    true_w = rng.normal(size=n_feat).astype(np.float32)
    x = rng.normal(size=(256, n_feat)).astype(np.float32)
    y = x @ true_w + float(cfg.get("noise", 0.1)) * rng.normal(size=256).astype(np.float32)
    x_tr, y_tr, x_va, y_va = x[:200], y[:200], x[200:], y[200:]

    os.makedirs(args.out, exist_ok=True)
    ckpt = os.path.join(args.out, "model.safetensors")
    w = np.zeros(n_feat, dtype=np.float32)
    start = 0
    if args.resume and os.path.exists(ckpt):
        state = load_file(ckpt)
        w, start = state["w"], int(state["epoch"][0])
        print(f"resumed from epoch {start}", flush=True)
    for epoch in range(start, args.epochs):
        grad = 2 * x_tr.T @ (x_tr @ w - y_tr) / len(y_tr)
        w = (w - lr * grad).astype(np.float32)
        val = float(np.mean((x_va @ w - y_va) ** 2))
        save_file({"w": w, "epoch": np.array([epoch + 1], dtype=np.int64)}, ckpt)
        print(f"epoch {epoch + 1}/{args.epochs} val_loss={val:.5f}", flush=True)
        if step_time:
            time.sleep(step_time)
    train_loss = float(np.mean((x_tr @ w - y_tr) ** 2))
    val_loss = float(np.mean((x_va @ w - y_va) ** 2))
    with open(os.path.join(args.out, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump({"val_loss": val_loss, "train_loss": train_loss, "epochs": args.epochs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
