#!/usr/bin/env python3
"""Reconcile throughput: `ablate reconcile --fs` on many small and a few large real checkpoints,
against `cat` of the same files to /dev/null (the disk's limit) in the same run.

Two throw-away local projects (profile `local`: the shared FS is a directory on this disk):
  small  1,000 cells, each a real safetensors checkpoint (written by safetensors.numpy)
  large  20 cells, each a ~200 MB checkpoint (safetensors by default, or torch.save with
         --large-format torch); with --shards K, each large cell's checkpoint is K shards of
         --large-mb each plus their `model.safetensors.index.json`, as Hugging Face's sharded
         `save_pretrained` writes them (`artifacts.checkpoint: "model*.safetensors*"`)
  one    with --torch-file-mb MB: one cell whose checkpoint is one torch.save file of MB MB (four
         float32 tensors), verified twice in the same run: `artifacts.verify: structure` (every zip
         record's CRC32 in the sha256's read, data.pkl read to STOP by stubs, every storage against
         its record: no torch) and the default (the same, then torch.load(weights_only=True, mmap=True))
Each result dir is what run_one publishes: the checkpoint, metrics.json, `<name>.log` and a
MANIFEST.json recording size and sha256 of each; the roster is one queue file of those cells.

The measured call is the real one: `ablate.results.reconcile.reconcile(project, fs=True)` (roster, verify of
every file by size, sha256 and loading, in its thread pool; classification; gate/reconcile.json),
and every cell must come out verified. `cat` reads exactly the files reconcile reads.

The page cache cannot be dropped here, so each file is evicted with posix_fadvise(DONTNEED) before a
"cold" measurement (what the disk delivers; on a VM that may include the host's cache), and read
once before a "warm" one. cat and reconcile alternate, cold then warm, for --reps repetitions; the
median is kept.

    python3 scripts/bench_reconcile.py [--small 1000] [--large 20] [--large-mb 200]
                                       [--large-format safetensors|torch] [--shards K]
                                       [--torch-file-mb 2000] [--reps 3] [--no-write]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import alternate, measured_line, publish, write_project

from ablate.config.project import load_project
from ablate.remote.checkpoints import artifacts, verify
from ablate.results.reconcile import reconcile


@dataclass
class Dataset:
    label: str
    proj: Path
    files: list[Path]
    cells: int
    mb: float  # the size of all its files
    verify: str | None = None  # artifacts.verify for every checkpoint entry (None: the default)


def sha(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_checkpoint(path: Path, fmt: str, mb: float, rng: np.random.Generator) -> None:
    """Four float32 tensors of mb/4 MB each (or one small layer when mb is tiny)."""
    n = max(64, int(mb * 1e6 / 4 / 4))
    tensors = {f"layer{i}.weight": rng.standard_normal(n, dtype=np.float32) for i in range(4)}
    if fmt == "torch":
        import torch

        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, path)
    else:
        from safetensors.numpy import save_file

        save_file(tensors, str(path))


def entry(d: Path, f: str) -> dict[str, object]:
    """A MANIFEST.json entry, as run_one records it."""
    return {"file": f, "size": (d / f).stat().st_size, "sha256": sha(d / f)}


def write_shards(d: Path, k: int, mb: float, rng: np.random.Generator) -> list[str]:
    """k safetensors shards of mb MB each and the index naming them (Hugging Face's layout)."""
    names = [f"model-{i + 1:05d}-of-{k:05d}.safetensors" for i in range(k)]
    wmap = {}
    for i, shard in enumerate(names):
        write_checkpoint(d / shard, "safetensors", mb, rng)
        wmap.update({f"block{i}.layer{j}.weight": shard for j in range(4)})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum((d / n).stat().st_size for n in names)}, "weight_map": wmap}))
    return [*names, "model.safetensors.index.json"]


def make_dataset(base: Path, label: str, n: int, mb: float, fmt: str, shards: int = 1) -> Dataset:
    ckpt = "model.pth" if fmt == "torch" else "model.safetensors"
    if shards > 1:
        ckpt = "model*.safetensors*"
    names = [f"{label}{i:05d}" for i in range(n)]
    proj = write_project(base / label, label, train="true {cfg} {ckpt_dir}",
                         artifacts={"checkpoint": ckpt, "metrics": "metrics.json",
                                    "metrics_keys": ["val_loss"]},
                         tasks={"t": {"epochs": 1}}, hosts={"h1": {}},
                         configs={name: f"seed: {i}\n" for i, name in enumerate(names)},
                         queues={"q": [f"configs/{name}.yaml t 1" for name in names]})
    project = load_project(proj)
    final = Path(project.sweep_root(project.host("h1"))) / "final_ckpts"
    rng = np.random.default_rng(7)
    files = []
    for i, name in enumerate(names):
        cfg = f"configs/{name}.yaml"
        d = final / name
        d.mkdir(parents=True)
        if shards > 1:
            ckpt_files = write_shards(d, shards, mb, rng)
        else:
            write_checkpoint(d / ckpt, fmt, mb, rng)
            ckpt_files = [ckpt]
        (d / "metrics.json").write_text(json.dumps({"val_loss": float(i)}))
        (d / f"{name}.log").write_text(f"# ablate run of {name}\nepoch 1/1 val_loss={i}\n")
        arts: dict[str, object] = {"checkpoint": [entry(d, f) for f in ckpt_files] if shards > 1
                                   else entry(d, ckpt),
                                   "metrics": entry(d, "metrics.json"), "log": entry(d, f"{name}.log")}
        (d / "MANIFEST.json").write_text(json.dumps({
            "name": name, "cfg": cfg, "task": "t", "epochs": 1, "cat": "configs",
            "cfg_sha256": sha(proj / cfg), "host": "h1", "queue": "q", "artifacts": arts}))
        files += [*(d / f for f in ckpt_files), d / "metrics.json", d / f"{name}.log", d / "MANIFEST.json"]
    for f in files:  # on disk, so "cold" means the disk and not dirty pages
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    return Dataset(label, proj, files, n, sum(f.stat().st_size for f in files) / 1e6)


def evict(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cat(files: list[Path]) -> None:
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)


def set_verify(ds: Dataset) -> None:
    """ablate.yaml's artifacts.verify as the dataset says (between measurements, not in them)."""
    path = ds.proj / "ablate.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["artifacts"].pop("verify", None)
    if ds.verify:
        cfg["artifacts"]["verify"] = ds.verify
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def run_reconcile(ds: Dataset) -> None:
    report = reconcile(load_project(ds.proj), fs=True)
    if not report.complete or report.verified != ds.cells:
        raise SystemExit(f"bench_reconcile: {ds.label}: {report.verified}/{ds.cells} verified: "
                         f"{report.corrupt[:2]} {report.missing[:2]}")
    if ds.label.startswith("one") and set(report.checkpoint_checks) != {ds.verify or "loaded"}:
        raise SystemExit(f"bench_reconcile: {ds.label}: checked {report.checkpoint_checks}")


def measure(ds: Dataset, reps: int) -> dict[str, float]:
    """median seconds of cat / reconcile, cold (every file evicted first) and warm (every file read
    once first); and of sha256 alone (warm, one process)."""
    set_verify(ds)

    def way(fn: Callable[[], object], before: Callable[[list[Path]], None] | None = None,
            ) -> Callable[[int], Callable[[], object]]:
        def prepare(_r: int) -> Callable[[], object]:
            if before is not None:
                before(ds.files)
            return fn
        return prepare

    last: dict[str, float] = {}

    def progress(w: str, r: int, secs: float) -> None:
        last[w] = secs
        if w == "sha256 warm":  # the round's last
            print(f"{ds.label} rep {r}: " + ", ".join(f"{k} {v:.2f}s" for k, v in last.items()),
                  file=sys.stderr)

    got = alternate({"cat cold": way(lambda: cat(ds.files), evict),
                     "reconcile cold": way(lambda: run_reconcile(ds), evict),
                     "cat warm": way(lambda: cat(ds.files), cat),
                     "reconcile warm": way(lambda: run_reconcile(ds), cat),
                     "sha256 warm": way(lambda: [artifacts.sha256_file(f) for f in ds.files])},
                    reps, after=progress)
    return {k: v.median for k, v in got.items()}


def num(x: float) -> str:
    """Three significant figures at most, thousands separated."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def table(rows: list[tuple[Dataset, dict[str, float]]]) -> list[str]:
    out = ["| files | cache | cat (MB/s) | reconcile (MB/s) | reconcile (cells/s) | reconcile / cat |",
           "|:--|:--|--:|--:|--:|--:|"]
    for ds, t in rows:
        for cache in ("cold", "warm"):
            c, r = ds.mb / t[f"cat {cache}"], ds.mb / t[f"reconcile {cache}"]
            out.append(f"| {ds.label}: {ds.cells} cells, {num(ds.mb)} MB | {cache} | {num(c)} | {num(r)} | "
                       f"{num(ds.cells / t[f'reconcile {cache}'])} | {r / c:.0%} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=1000, help="cells with a small checkpoint (default 1000)")
    ap.add_argument("--large", type=int, default=20, help="cells with a large checkpoint (default 20)")
    ap.add_argument("--large-mb", type=float, default=200, help="size of a large checkpoint (default 200)")
    ap.add_argument("--large-format", choices=("safetensors", "torch"), default="safetensors")
    ap.add_argument("--shards", type=int, default=1,
                    help="shards per large checkpoint, each --large-mb (default 1: one file)")
    ap.add_argument("--torch-file-mb", type=float, default=0,
                    help="also one cell of one torch file this large, by structure and by default (MB)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions; the median is kept (default 3)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md alone")
    args = ap.parse_args(argv)
    reps = max(1, args.reps)
    rows = []
    where = os.environ.get("TMPDIR", "/var/tmp")  # a disk, not a tmpfs /tmp
    with tempfile.TemporaryDirectory(prefix="ablate-bench-rec-", dir=where) as tmp:
        for label, n, mb, fmt in (("small", args.small, 0.016, "safetensors"),
                                  ("large", args.large, args.large_mb, args.large_format)):
            if n <= 0:
                continue
            t0 = time.perf_counter()
            k = args.shards if label == "large" else 1
            ds = make_dataset(Path(tmp), label, n, mb, fmt, k)
            took = time.perf_counter() - t0
            print(f"{label}: wrote {n} cells, {ds.mb:,.0f} MB in {took:.1f}s", file=sys.stderr)
            rows.append((ds, measure(ds, reps)))
            ds.label = f"{label} ({fmt}{f', {k} x {mb:g} MB shards + index' if k > 1 else ''})"
        if args.torch_file_mb > 0:
            one = make_dataset(Path(tmp), "one", 1, args.torch_file_mb, "torch")
            print(f"one: wrote 1 cell, {one.mb:,.0f} MB", file=sys.stderr)
            run_reconcile(one)  # torch imported once, as by one `ablate reconcile`: not measured
            for how, label in (("structure", "verify: structure"),
                               (None, "default: structure, then torch.load mmap")):
                ds = Dataset(f"one torch file ({label})", one.proj, one.files, 1, one.mb, how)
                rows.append((ds, measure(ds, reps)))
        lines = table(rows)
    print(f"{os.cpu_count()} CPU(s); median of {reps}")
    print("\n".join(lines))
    notes = []
    for ds, t in rows:
        if ds.label.startswith("one"):
            cold = t["cat cold"] / t["reconcile cold"]
            notes.append(f"{ds.label}, cold: reconcile at {cold:.0%} of the cat rate "
                         f"(target >= 50%: {'met' if cold >= 0.5 else 'MISSED'})")
        if ds.label.startswith("large"):
            cold = t["cat cold"] / t["reconcile cold"]
            warm = t["cat warm"] / t["reconcile warm"]
            notes.append(f"large files, cold: reconcile at {cold:.0%} of the cat rate, the disk's limit "
                         f"(target >= 50%: {'met' if cold >= 0.5 else 'MISSED'})")
            notes.append(f"large files, warm: reconcile at {warm:.0%} of the cat rate (memory bandwidth; "
                         "for reference)")
            workers = min(os.cpu_count() or 1, verify.MAX_WORKERS,
                          ds.cells * (args.shards + 1 if args.shards > 1 else 1))
            rate = num(ds.mb / t["sha256 warm"])
            notes.append(f"the CPU ceiling: sha256 alone in one process (warm) {rate} MB/s; verify hashes "
                         f"in {workers} worker thread(s)")
    print("\n".join(notes))
    if not args.no_write:
        cmd = (f"python3 scripts/bench_reconcile.py --small {args.small} --large {args.large} "
               f"--large-mb {args.large_mb:g} --large-format {args.large_format}"
               + (f" --shards {args.shards}" if args.shards > 1 else "")
               + (f" --torch-file-mb {args.torch_file_mb:g}" if args.torch_file_mb > 0 else "")
               + f" --reps {reps}")
        kind = "sharded" if args.shards > 1 else args.large_format
        what = (f"{args.shards} x {args.large_mb:g} MB safetensors shards per cell" if args.shards > 1
                else args.large_format)
        heading = f"## Reconcile throughput (`ablate reconcile --fs`, large checkpoints: {what})"
        about = ("`reconcile(project, fs=True)` (size, sha256 and a load of every artifact by "
                 "`ablate.remote.checkpoints.verify`, in its thread pool; every cell verified)")
        if args.torch_file_mb > 0 and args.large <= 0 and args.small <= 0:
            kind = "torch_structure"
            cmd = (f"python3 scripts/bench_reconcile.py --small 0 --large 0 --torch-file-mb "
                   f"{args.torch_file_mb:g} --reps {reps}")
            heading = (f"## Reconcile throughput, structural verification of one "
                       f"{args.torch_file_mb:g} MB torch file")
            about = ("`reconcile(project, fs=True)` of one cell whose checkpoint is one torch.save file, "
                     "first with `artifacts.verify: structure` (the sha256 and every zip record's CRC32 "
                     "in one read, on two threads; data.pkl read to STOP by stubs; every storage against "
                     "its record; torch never imported), then by default (the same, then "
                     "torch.load(weights_only=True, mmap=True); torch imported once before measuring)")
        publish(f"bench_reconcile_{kind}", [
            heading, "",
            measured_line(cmd), "",
            "Real checkpoints written by the real libraries into result dirs as run_one publishes them "
            "(checkpoint, metrics.json, log, MANIFEST.json with size + sha256), on this machine's disk. "
            f"{about} against `cat` of the same files to /dev/null. "
            "Cold: each file evicted with posix_fadvise(DONTNEED) first (the page cache cannot be "
            f"dropped here); warm: read once first. cat and reconcile alternate; median of {reps}.", "",
            *lines, "", *(f"- {n}" for n in notes), ""], True, echo=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
