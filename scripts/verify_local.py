#!/usr/bin/env python3
"""Verify a directory of pulled results by loading every artifact (stdlib + the loaders it needs).

    python scripts/verify_local.py results/ablation-v1 --checkpoint best.pth \\
        --metrics metrics.json --keys val_loss [--no-load] [--json] [--workers N]

DIR is either a directory of `<name>/` result dirs or one result dir (it holds MANIFEST.json).
Exit 0 when every dir verifies, 1 when any has a problem, 2 on bad usage.
It checks files only: `ablate reconcile` also compares the results with the roster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

try:
    from ablate.remote.checkpoints import verify
except ImportError:  # run from a checkout without installing: the package sits beside scripts/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from ablate.remote.checkpoints import verify


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("dir", help="directory of result dirs, or one result dir")
    ap.add_argument("--checkpoint", required=True, action="append",
                    help="a checkpoint entry: file, directory or glob (artifacts.checkpoint; repeat "
                         "for a list)")
    ap.add_argument("--metrics", help="metrics JSON file name (artifacts.metrics)")
    ap.add_argument("--keys", default="", help="comma-separated keys the metrics must hold")
    ap.add_argument("--no-load", action="store_true", help="sizes and hashes only; do not load")
    ap.add_argument("--workers", type=int, help="parallel processes (default: CPU count)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    keys = [k for k in args.keys.split(",") if k]
    if keys and not args.metrics:
        ap.error("--keys needs --metrics")
    root = os.path.abspath(args.dir)
    if not os.path.isdir(root):
        print(f"error: {root} is not a directory", file=sys.stderr)
        return 2
    artifacts = {"checkpoint": args.checkpoint, "metrics": args.metrics, "metrics_keys": keys}
    single = os.path.exists(os.path.join(root, verify.MANIFEST))
    out = verify.verify_tree({
        "dir": os.path.dirname(root) if single else root,
        "names": [os.path.basename(root)] if single else None,
        "artifacts": artifacts, "load": not args.no_load, "workers": args.workers,
    })
    cells = {n: c for n, c in out["cells"].items() if c["problems"] is not None}
    bad = {n: c["problems"] for n, c in cells.items() if c["problems"]}
    if args.json:
        print(json.dumps({"dir": root, "checked": len(cells), "verified": len(cells) - len(bad),
                          "problems": bad}))
    else:
        for name, problems in sorted(bad.items()):
            for p in problems:
                print(f"{name}: {p['file'] or '-'}: {p['kind']}: {p['error']}")
        how = "loaded" if not args.no_load else "size+hash checked"
        print(f"{len(cells) - len(bad)}/{len(cells)} result dirs verified ({how}) in {root}")
    return 1 if bad or not cells else 0


if __name__ == "__main__":
    sys.exit(main())
