"""A real Hugging Face `Trainer` run for the resume tests: a tiny GPT-2 trained on CPU for
`--steps` steps, a checkpoint every 2 (`save_steps`, `save_total_limit=2`, the library's own
`trainer/checkpoint-N/` dirs with pickled `training_args.bin` and numpy RNG state), resumed the
way users resume (`train(resume_from_checkpoint=True)`, which raises when there is none).

    python hf_resume_train.py --config CFG --out CKPT_DIR --resume 0|1 --steps N --name NAME

`faults/<name>.hold` (in the working directory) holds the run after the save of step N (its
content) for as long as the file exists: a cell caught mid-run, deterministically. At the end:
`metrics.json` ({"val_loss", "global_step"}) and `trace.jsonl` lines `{"ev": "start", "resumed":
bool, "first_step": S}`, the step the run began at.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class _Hold(TrainerCallback):  # type: ignore[misc]
    def __init__(self, name: str) -> None:
        self.name = name

    def on_save(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        marker = Path("faults") / f"{self.name}.hold"
        while marker.exists() and state.global_step >= int(_text(marker) or 0):
            time.sleep(0.1)
        return control


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class _First(TrainerCallback):  # type: ignore[misc]
    def __init__(self, out: str, resumed: bool) -> None:
        self.out, self.resumed, self.done = out, resumed, False

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if not self.done:
            self.done = True
            with open(os.path.join(self.out, "trace.jsonl"), "a", encoding="utf-8") as f:
                f.write(json.dumps({"ev": "start", "resumed": self.resumed, "first_step": state.global_step,
                                    "pid": os.getpid(), "t": time.time()}) + "\n")
        return control


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)  # the cell's config (each cell trains its own)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--name", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                       bos_token_id=0, eos_token_id=0))
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (32, 16), generator=g)]
    args = TrainingArguments(output_dir=os.path.join(a.out, "trainer"), max_steps=a.steps, save_steps=2,
                             save_total_limit=2, per_device_train_batch_size=4, report_to=[],
                             logging_steps=1, use_cpu=True, seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[_First(a.out, bool(a.resume)), _Hold(a.name)])
    out = trainer.train(resume_from_checkpoint=True if a.resume else None)
    with open(os.path.join(a.out, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump({"val_loss": float(out.training_loss), "global_step": trainer.state.global_step}, f)


if __name__ == "__main__":
    main()
