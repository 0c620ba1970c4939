"""Checkpoint directories written by the real frameworks (once per installation of them: kept across
runs by tests/test_verify_frameworks.py), and the result dirs made from them as run_one publishes
them (MANIFEST.json written *after* any damage: a torn write the trainer left, published with its
matching hash, so only the structure can tell).

    python -m tests.helpers.framework_ckpts OUT

writes, each with the real library on the CPU (no hub download, tiny models):
  OUT/trainer/checkpoint-2/   transformers.Trainer, a tiny LlamaConfig model, 2 steps, save_steps=2
  OUT/sharded/                save_pretrained(max_shard_size=...) of the same model: shards + index
  OUT/lightning/              lightning.Trainer with save_hyperparameters() of an argparse.Namespace
  OUT/accelerate/             accelerate.Accelerator().save_state
  OUT/dcp/                    torch.distributed.checkpoint.save, one process, no process group
  OUT/peft/                   peft's LoRA adapter save_pretrained
  OUT/deepspeed/              deepspeed.initialize (ZeRO stage 1, CPU, one rank) + save_checkpoint;
                              if deepspeed cannot be imported, its documented layout written with
                              torch.save (OUT/deepspeed/WRITTEN_BY says which)
  OUT/legacy/model.pt         torch.save(_use_new_zipfile_serialization=False)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import socket
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
    return LlamaForCausalLM(cfg)


def trainer(out: Path) -> None:
    import torch
    from transformers import Trainer, TrainingArguments

    data = [{"input_ids": torch.arange(8) % 64, "labels": torch.arange(8) % 64} for _ in range(8)]
    args = TrainingArguments(output_dir=str(out / "trainer"), max_steps=2, save_steps=2,
                             save_strategy="steps", per_device_train_batch_size=4, report_to=[],
                             use_cpu=True, disable_tqdm=True, logging_strategy="no")
    Trainer(model=_llama(), args=args, train_dataset=data).train()
    _llama().save_pretrained(out / "sharded", max_shard_size="8KB")


def lightning(out: Path) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Module(L.LightningModule):
        def __init__(self, args: argparse.Namespace) -> None:
            super().__init__()
            self.save_hyperparameters()  # {"args": Namespace(...)}, as an argparse script has it
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, _: int) -> Any:
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 8)), batch_size=4)
    t = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=str(out),
                  callbacks=[ModelCheckpoint(dirpath=str(out / "lightning"))])
    t.fit(Module(argparse.Namespace(lr=0.1, layers=2)), data)


def _step(model: Any, opt: Any) -> None:
    import torch

    model(torch.randn(2, 8)).sum().backward()
    opt.step()


def accelerate(out: Path) -> None:
    import torch
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    model, opt, sched = acc.prepare(model, opt, sched)
    _step(model, opt)
    acc.save_state(str(out / "accelerate"))


def dcp(out: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dist_cp

    g = torch.Generator().manual_seed(0)
    dist_cp.save({"model": {"w": torch.randn(64, 32, generator=g), "b": torch.zeros(32)}, "step": 3},
                 checkpoint_id=str(out / "dcp"))


def peft(out: Path) -> None:
    from peft import LoraConfig, get_peft_model

    get_peft_model(_llama(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(
        str(out / "peft"))


def deepspeed(out: Path) -> None:
    import torch

    d = out / "deepspeed"
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                          RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        import deepspeed as ds
        import deepspeed.ops

        # Its shared-memory allreduce is compiled on first use (40 s); one rank has no use for it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        model = torch.nn.Linear(8, 4)
        engine, *_ = ds.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                   config={"train_micro_batch_size_per_gpu": 2,
                                           "zero_optimization": {"stage": 1},
                                           "zero_allow_untested_optimizer": True})
        engine.backward(engine(torch.randn(2, 8)).sum())
        engine.step()
        engine.save_checkpoint(str(d))
        (d / "WRITTEN_BY").write_text(f"deepspeed {ds.__version__}\n")
    except ImportError:
        # DeepSpeed's documented layout (save_checkpoint), written with torch.save.
        tag = d / "global_step1"
        tag.mkdir(parents=True)
        w = torch.randn(4, 8)
        torch.save({"module": {"weight": w, "bias": torch.zeros(4)}, "dp_world_size": 1,
                    "mp_world_size": 1, "global_steps": 1,
                    "ds_config": {"zero_optimization": {"stage": 1}}}, tag / "mp_rank_00_model_states.pt")
        torch.save({"optimizer_state_dict": {"exp_avg": torch.zeros(36)}, "ds_version": "layout"},
                   tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
        (d / "latest").write_text("global_step1")
        (d / "WRITTEN_BY").write_text("torch.save, DeepSpeed's documented layout\n")


def legacy(out: Path) -> None:
    import torch

    (out / "legacy").mkdir()
    torch.save({"w": torch.arange(64, dtype=torch.float32), "epoch": 3}, out / "legacy" / "model.pt",
               _use_new_zipfile_serialization=False)


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.manual_seed(0)
    for write in (trainer, lightning, accelerate, dcp, peft, deepspeed, legacy):
        write(out)
    return 0


# ---- result dirs made from them (the test process; nothing above is imported there) ----

def publish(parent: Path, name: str, src: Path, entry: str,
            damage: Callable[[Path], None] | None = None) -> Path:
    """`<parent>/<name>/` as run_one publishes it: the files under `src` copied to `<entry>/`, then
    `damage(cell_dir)`, then metrics, log and a MANIFEST.json recording every file as it now is."""
    d = parent / name
    shutil.copytree(src, d / entry, ignore=shutil.ignore_patterns("WRITTEN_BY", "*.py", "README.md"))
    if damage is not None:
        damage(d)
    (d / "metrics.json").write_text(json.dumps({"val_loss": 0.5}))
    (d / f"{name}.log").write_text("done\n")
    files = sorted(p.relative_to(d).as_posix() for p in (d / entry).rglob("*") if p.is_file())

    def rec(rel: str) -> dict[str, Any]:
        data = (d / rel).read_bytes()
        return {"file": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    (d / "MANIFEST.json").write_text(json.dumps({
        "name": name, "cfg": f"{name}.yaml", "task": "t", "epochs": 1, "host": "h1", "queue": "q1",
        "artifacts": {"checkpoint": [rec(f) for f in files], "metrics": rec("metrics.json"),
                      "log": rec(f"{name}.log")}}))
    return d


def data_offsets(blob: bytes, base: int = 0) -> dict[str, tuple[int, int]]:
    """{record name: (offset of its data in the file, size)} of a zip archive held in `blob`, which
    starts at `base` in its file (zipfile for the directory, the local headers for the offsets)."""
    out = {}
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        for i in z.infolist():
            n, m = int.from_bytes(blob[i.header_offset + 26:i.header_offset + 28], "little"), \
                int.from_bytes(blob[i.header_offset + 28:i.header_offset + 30], "little")
            out[i.filename] = (base + i.header_offset + 30 + n + m, i.compress_size)
    return out


def flip_tensor_byte(path: Path, base: int = 0, length: int | None = None) -> str:
    """Flip one byte in the middle of the largest tensor record of the torch archive at
    [base, base + length) of `path` (size unchanged). Returns the record's name."""
    data = bytearray(path.read_bytes())
    blob = bytes(data[base:base + length if length is not None else len(data)])
    records = {k: v for k, v in data_offsets(blob, base).items() if "/data/" in k}
    name = max(records, key=lambda k: records[k][1])
    off, size = records[name]
    data[off + size // 2] ^= 0x40
    path.write_bytes(bytes(data))
    return name


def rewrite_record(path: Path, name_suffix: str, change: Callable[[bytes], bytes]) -> str:
    """Rewrite a torch zip with one record's bytes changed, its CRC32 correct again (a pickle cut
    short or a storage short, as a writer that died mid-way and a zip tool that closed the archive
    would leave it). Returns the record's name."""
    src = zipfile.ZipFile(io.BytesIO(path.read_bytes()))
    buf = io.BytesIO()
    done = ""
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith(name_suffix) and not done:
                data, done = change(data), info.filename
            dst.writestr(info.filename, data)
    path.write_bytes(buf.getvalue())
    return done


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
