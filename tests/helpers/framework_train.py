"""A trainer that leaves its checkpoint the way a framework writes it, with the real libraries.

    python framework_train.py --style hf|peft|lightning|deepspeed --config CFG --epochs N --out DIR

  hf         transformers' `save_pretrained(max_shard_size=...)` of a tiny randomly initialised
             GPT-2 into DIR/hf: `model-0000k-of-0000N.safetensors`, `model.safetensors.index.json`,
             `config.json`, `generation_config.json`
  peft       `adapter_model.safetensors` + `adapter_config.json` as PEFT writes a LoRA adapter
  lightning  one `epoch=E-step=S.ckpt` per epoch (torch.save of Lightning's dict: state_dict,
             epoch, global_step), the last one newest
  deepspeed  one `global_stepS/` directory per epoch (mp_rank_00_model_states.pt,
             zero_pp_rank_0_mp_rank_00_optim_states.pt) and a `latest` file naming the last one
Every style also writes `metrics.json` ({"val_loss": ...}) beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

STEPS_PER_EPOCH = 10


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"layer.weight": torch.randn(16, 8, generator=g), "layer.bias": torch.randn(16, generator=g)}


def hf(out: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32,
                     bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(out / "hf", max_shard_size="100KB")


def peft(out: Path) -> None:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    save_file({"base_model.model.layer.lora_A.weight": torch.randn(4, 8, generator=g),
               "base_model.model.layer.lora_B.weight": torch.zeros(16, 4)},
              str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["layer"]}))


def lightning(out: Path, epochs: int) -> None:
    for e in range(epochs):
        step = (e + 1) * STEPS_PER_EPOCH
        torch.save({"state_dict": _state(e), "epoch": e, "global_step": step},
                   out / f"epoch={e}-step={step}.ckpt")
        time.sleep(0.02)  # distinct modification times, as epochs apart have


def deepspeed(out: Path, epochs: int) -> None:
    for e in range(epochs):
        step = (e + 1) * STEPS_PER_EPOCH
        d = out / f"global_step{step}"
        d.mkdir(parents=True, exist_ok=True)
        torch.save({"module": _state(e)}, d / "mp_rank_00_model_states.pt")
        torch.save({"optimizer_state_dict": {"exp_avg": torch.zeros(16, 8)}},
                   d / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
        (out / "latest").write_text(f"global_step{step}")
        time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--style", required=True, choices=("hf", "peft", "lightning", "deepspeed"))
    ap.add_argument("--config", required=True)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.style == "hf":
        hf(out)
    elif args.style == "peft":
        peft(out)
    elif args.style == "lightning":
        lightning(out, args.epochs)
    else:
        deepspeed(out, args.epochs)
    tmp = out / "metrics.json.tmp"
    tmp.write_text(json.dumps({"val_loss": 1.0 / (1 + args.epochs)}))
    os.replace(tmp, out / "metrics.json")
    print(f"epoch {args.epochs}/{args.epochs} saved ({args.style})", flush=True)


if __name__ == "__main__":
    main()
