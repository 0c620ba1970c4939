"""A trainer that talks to its service first, as an RL trainer talks to its inference server:

    python svc_train.py --url http://127.0.0.1:{port}/ --out {ckpt_dir} -- TRAIN COMMAND...

GET the URL (the service answers with its pid), record the answer in `<out>/service.json`, then
exec the train command after `--` (ablate's demo trainer: a real checkpoint and metrics). A service
that does not answer is a training failure (exit 1), as it would be for a real trainer. Stdlib only,
so a test bed instance runs it from the shared workdir.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path


def main() -> None:
    argv = sys.argv[1:]
    sep = argv.index("--")
    own, rest = argv[:sep], argv[sep + 1:]
    url = own[own.index("--url") + 1]
    out = Path(own[own.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            answer = json.loads(r.read())
    except OSError as e:
        print(f"svc_train: the service at {url} does not answer: {e}", flush=True)
        sys.exit(1)
    (out / "service.json").write_text(json.dumps(answer))
    print(f"svc_train: service pid {answer.get('pid')} answered", flush=True)
    os.execvp(rest[0], rest)


if __name__ == "__main__":
    main()
