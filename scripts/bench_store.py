#!/usr/bin/env python3
"""Upload and verify of one large checkpoint through ablate's object store (`ablate/remote/store/client.py`)
against boto3 alone and `aws s3 cp`, side by side, on the same endpoint in one run.

One file of random bytes (`--size`, default 2 GB) is written once to a temporary directory and its
sha256 taken once (run_one's publish has it already, for MANIFEST.json). Then, `--reps` times, in
an order that rotates each repetition:

- boto3: `client.upload_file` with the default TransferConfig;
- aws: `aws s3 cp FILE s3://...` (when the AWS CLI is installed), a process of its own;
- ablate: `Store.upload` then `Store.head`, the size checked: what a publish does per file
  (ablate/remote/store/queue_side.py) before its commit;
- ablate, read back: the same upload, then `Store.download` and its sha256 compared with the file's.

Each upload goes to a key of its own and is deleted after its repetition. The figures are medians;
each ratio is the baseline's time over ablate's (≥ 1 means ablate is as fast), so the target is
`ablate / boto3 ≥ 0.5`.

Without `--endpoint`, a moto server (`moto_server`, a process of its own so that it does not share
this process's interpreter) on 127.0.0.1 with fake credentials is the store; moto keeps objects in
memory and temporary files, so it measures the client's work and the local HTTP path, not a
network. With `--endpoint URL --bucket B`, a real store and the AWS chain's credentials.

    python3 scripts/bench_store.py [--size 2GB] [--reps 3] [--endpoint URL --bucket B] [--prefix P]
                                   [--tmp DIR] [--json FILE] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import ablate_version, alternate, measured_line, median, publish, ratio

from ablate.config.project import parse_size
from ablate.remote.store.client import Store

FAKE = {"AWS_ACCESS_KEY_ID": "AKIABENCHSTORE000001", "AWS_SECRET_ACCESS_KEY": "bench-store-secret-0123456789",
        "AWS_DEFAULT_REGION": "us-east-1"}
CHUNK = 64 << 20


@contextlib.contextmanager
def moto_server(log: Path) -> Iterator[str]:
    """A moto server in a process of its own on a free port: its endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("moto_server")
    argv = [exe] if exe else [sys.executable, "-m", "moto.server"]
    with log.open("wb") as out:
        proc = subprocess.Popen([*argv, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"moto_server did not start: {log.read_text()[-500:]}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def random_file(path: Path, size: int) -> str:
    """`size` random bytes at `path`; their sha256."""
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            block = os.urandom(min(CHUNK, left))
            h.update(block)
            f.write(block)
            left -= len(block)
    return h.hexdigest()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2GB", help="the file's size (2GB, 500MB, ...)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--endpoint", help="a real store's endpoint (default: a moto server here)")
    ap.add_argument("--bucket", help="with --endpoint: a bucket these credentials may write")
    ap.add_argument("--prefix", default="ablate-bench")
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where the file and its read-back go")
    ap.add_argument("--no-aws-cli", action="store_true", help="leave `aws s3 cp` out")
    ap.add_argument("--json", help="also write the figures to this file as JSON")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    size = parse_size(args.size, "--size")
    if args.endpoint and not args.bucket:
        ap.error("--endpoint needs --bucket")
    free = shutil.disk_usage(args.tmp).free
    need = size * (2 if args.endpoint else 4)  # the file, its read-back; moto's copies on this disk
    if free < need + (1 << 30):
        raise SystemExit(f"{args.tmp}: {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB + 1 GB needed "
                         f"for a {size / 1e9:.1f} GB file; give --tmp or a smaller --size")
    aws = None if args.no_aws_cli else shutil.which("aws")
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="bench_store.") as d:
        work = Path(d)
        with contextlib.ExitStack() as stack:
            if args.endpoint:
                endpoint, bucket = args.endpoint, args.bucket
            else:
                os.environ.update(FAKE)
                os.environ["TMPDIR"] = str(work)  # moto's spooled objects land here, removed with it
                endpoint, bucket = stack.enter_context(moto_server(work / "moto.log")), "bench-store"
            figures = run(args, size, work, endpoint, bucket, aws)
    report(args, size, figures, aws)


def run(args: argparse.Namespace, size: int, work: Path, endpoint: str, bucket: str,
        aws: str | None) -> dict[str, list[float]]:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name=os.environ.get("AWS_DEFAULT_REGION",
                                                                                   "us-east-1"))
    if not args.endpoint:
        client.create_bucket(Bucket=bucket)
    run_id = uuid.uuid4().hex[:8]
    src, back = work / "checkpoint.bin", work / "readback.bin"
    t = time.perf_counter()
    digest = random_file(src, size)
    print(f"wrote {size / 1e6:.0f} MB of random bytes in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    store = Store(f"s3://{bucket}/{args.prefix}/{run_id}", endpoint, wait=60)

    def boto3_alone(key: str) -> Callable[[], None]:
        return lambda: client.upload_file(str(src), bucket, store.key(key))

    def aws_cp(key: str) -> Callable[[], None]:
        argv = [aws or "aws", "s3", "cp", "--only-show-errors", str(src), store.where(key)]
        argv += ["--endpoint-url", endpoint] if endpoint else []
        def go() -> None:
            subprocess.run(argv, check=True)
        return go

    def ablate(key: str) -> Callable[[], None]:
        def go() -> None:
            store.upload(key, str(src))
            got = store.head(key)
            if got is None or got.size != size:
                raise SystemExit(f"{store.where(key)}: {got.size if got else 'no'} bytes after upload")
        return go

    def ablate_read_back(key: str) -> Callable[[], None]:
        def go() -> None:
            ablate(key)()
            store.download(key, str(back))
            if sha256(back) != digest:
                raise SystemExit(f"{store.where(key)}: read back, its sha256 differs")
            back.unlink()
        return go

    ways: dict[str, Callable[[str], Callable[[], None]]] = {"boto3": boto3_alone, "ablate": ablate,
                                                           "ablate_read_back": ablate_read_back}
    if aws:
        ways["aws"] = aws_cp

    def done(w: str, rep: int, secs: float) -> None:
        store.delete(f"{w}/{rep}")
        print(f"rep {rep + 1}: {w} {secs:.2f} s", file=sys.stderr)

    got = alternate({w: lambda rep, w=w: ways[w](f"{w}/{rep}") for w in ways}, args.reps, rotate=True,
                    after=done)
    return {w: list(x.secs) for w, x in got.items()}


MOTO_NOTE = ("moto measures the client's work and the local HTTP path, not a network. Its read-back row is "
             "moto's own cost: moto builds the whole object for every ranged GET and slices it, so a "
             "download in N ranges reads the object N times there (for 500 MB, boto3's default "
             "`download_file` in 8 MB ranges took 16.6 s, `Store.download` in 64 MB ranges 2.4 s). A publish "
             "reads nothing back: each file's sha256 is taken when it is copied into the staging directory, "
             "and after its upload the store's size of it is checked by HEAD (the ablate row).")
ROWS = {"boto3": "boto3 alone: `upload_file`, default TransferConfig",
        "aws": "`aws s3 cp` (a process of its own)",
        "ablate": "ablate: `Store.upload` + HEAD, the size checked (a publish's per-file work)",
        "ablate_read_back": "ablate, read back: `Store.upload` + HEAD + `Store.download` + sha256"}


def report(args: argparse.Namespace, size: int, figures: dict[str, list[float]], aws: str | None) -> None:
    med = {w: median(xs) for w, xs in figures.items()}
    where = (f"`{args.endpoint}`" if args.endpoint
             else "a moto server on this machine (`moto_server`, a process of its own)")
    cmd = f"python3 scripts/bench_store.py --size {args.size} --reps {args.reps}"
    cmd += f" --endpoint {args.endpoint} --bucket {args.bucket}" if args.endpoint else ""
    lines = ["## Object store: upload and verify", "",
             measured_line(cmd) + f" ablate {ablate_version(('ablate/remote/store/client.py',))}.", "",
             f"One file of {size / 1e6:.0f} MB of random bytes uploaded to {where}, each way {args.reps} "
             "times, the ways' order rotating each repetition; medians. vs boto3 = boto3's time / this "
             "way's (the target: ablate ≥ 0.5).", "",
             "| way | median (s) | MB/s | vs boto3 | runs (s) |", "|:--|--:|--:|--:|:--|"]
    for w in ("boto3", "aws", "ablate", "ablate_read_back"):
        if w in med:
            runs = ", ".join(f"{x:.2f}" for x in figures[w])
            lines.append(f"| {ROWS[w]} | {med[w]:.2f} | {size / 1e6 / med[w]:.0f} | "
                         f"{ratio(med['boto3'], med[w]):.2f} | {runs} |")
    vs_boto3 = ratio(med["boto3"], med["ablate"])
    lines += ["", f"ablate's upload and verify at {vs_boto3:.0%} of boto3 alone"
              + (f", {ratio(med['aws'], med['ablate']):.0%} of `aws s3 cp`" if "aws" in med else "")
              + f": target ≥ 50 %, {'met' if vs_boto3 >= 0.5 else 'missed'}."]
    if not args.endpoint:
        lines += ["", MOTO_NOTE]
    if args.json:
        Path(args.json).write_text(json.dumps({"size": size, "reps": args.reps, "endpoint": args.endpoint,
                                               "seconds": figures, "median": med,
                                               "ratio_vs_boto3": vs_boto3}, indent=1) + "\n")
    publish("bench_store", lines, not args.no_write)


if __name__ == "__main__":
    main()
