"""A real Lightning run for the resume tests: a tiny regression on CPU, one checkpoint per epoch
(`ModelCheckpoint(save_last="link")`: `ckpts/epoch=E-step=S.ckpt` and `ckpts/last.ckpt`, a symbolic
link to the newest), resumed the way users resume (`fit(ckpt_path="last")`, the newest
`*last*.ckpt` by mtime).

    python lightning_resume_train.py --config CFG --out CKPT_DIR --resume 0|1 --epochs N --name NAME

`faults/<name>.hold` (in the working directory) holds the run at the start of the epoch after
epoch N (its content) for as long as the file exists, its checkpoint of epoch N saved. At the end:
`metrics.json` ({"val_loss", "epochs"}); `trace.jsonl` gets `{"ev": "start", "resumed",
"first_epoch"}` for each run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint


class Tiny(L.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Hold(Callback):  # type: ignore[misc]
    def __init__(self, name: str, out: str, resumed: bool) -> None:
        self.name, self.out, self.resumed = name, out, resumed

    def on_train_start(self, trainer, module):  # type: ignore[no-untyped-def]
        with open(os.path.join(self.out, "trace.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps({"ev": "start", "resumed": self.resumed,
                                "first_epoch": trainer.current_epoch, "pid": os.getpid()}) + "\n")

    def on_train_epoch_start(self, trainer, module):  # type: ignore[no-untyped-def]
        marker = Path("faults") / f"{self.name}.hold"
        while marker.exists() and trainer.current_epoch >= int(_text(marker) or 0):
            time.sleep(0.1)


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--name", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    pairs = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    data = torch.utils.data.DataLoader(pairs, batch_size=16)
    ckpt = ModelCheckpoint(dirpath=os.path.join(a.out, "ckpts"), save_last="link", save_top_k=-1,
                           every_n_epochs=1)
    trainer = L.Trainer(max_epochs=a.epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[ckpt, Hold(a.name, a.out, bool(a.resume))])
    model = Tiny()
    trainer.fit(model, data, ckpt_path="last" if a.resume else None)
    with torch.no_grad():
        loss = float(torch.nn.functional.mse_loss(model.layer(x), x.sum(1, keepdim=True)))
    with open(os.path.join(a.out, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump({"val_loss": loss, "epochs": trainer.current_epoch}, f)


if __name__ == "__main__":
    main()
