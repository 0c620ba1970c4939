"""A small real HTTP server to run as a service beside the trainer (stdlib only).

    python svc_server.py --port P [--ready-after S] [--never-ready] [--pidfile F]

It listens at once; `GET /health` answers 503 until `--ready-after` seconds have passed (never with
--never-ready), then 200; `GET /` answers 200 with `{"pid": <its pid>, "port": P}`. It prints a line
when it starts and when it is ready, and exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ready-after", type=float, default=0.0)
    ap.add_argument("--never-ready", action="store_true")
    ap.add_argument("--pidfile")
    args = ap.parse_args()
    t0 = time.monotonic()
    said = False

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            nonlocal said
            ready = not args.never_ready and time.monotonic() - t0 >= args.ready_after
            if self.path == "/health":
                code, body = (200, b"ok") if ready else (503, b"warming up")
                if ready and not said:
                    said = True
                    print(f"svc_server: ready on port {args.port}", flush=True)
            else:
                code, body = 200, json.dumps({"pid": os.getpid(), "port": args.port}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    if args.pidfile:
        with open(args.pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(args.pidfile + ".tmp", args.pidfile)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"svc_server: listening on port {args.port} (pid {os.getpid()})"
          + (", never ready: the model failed to load" if args.never_ready else ""), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
