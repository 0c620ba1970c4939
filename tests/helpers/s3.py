"""A real S3 HTTP endpoint on this machine: moto in server mode (it enforces conditional writes:
`If-None-Match: *` and `If-Match`), one bucket, and the fake credentials the clients use."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

CREDS = {"AWS_ACCESS_KEY_ID": "AKIAABLATETEST000001",
         "AWS_SECRET_ACCESS_KEY": "ablate-test-secret-0123456789", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")


BACKOFF_SHARE = 0.05  # of botocore's backoff, under `quick_backoff`


def quick_backoff(monkeypatch: Any) -> None:
    """botocore's backoff between its attempts (in its "standard" mode a random part of 1 s, then of
    2 s, 4 s...) BACKOFF_SHARE as long in this process, until the test ends: the same requests and
    retries, each with its random wait, only shorter (a throttled test waited ~1.5 s per throttle)."""
    from botocore.retries.standard import ExponentialBackoff

    full = ExponentialBackoff.delay_amount
    monkeypatch.setattr(ExponentialBackoff, "delay_amount",
                        lambda self, context: full(self, context) * BACKOFF_SHARE)


def read_botocore_data_once() -> None:
    """Every `Store` makes its own boto3 session, and every session reads and parses botocore's JSON
    data files (the S3 model, endpoints, partitions) anew: three quarters of a client's cost, a tenth
    of a second of CPU each. In this process they are parsed once and shared, as one session's
    clients share them (botocore's own cache is per session); the files never change."""
    import botocore.loaders as loaders

    load = loaders.JSONFileLoader.load_file
    if getattr(load, "__name__", "") == "load_file_once":
        return
    parsed: dict[str, Any] = {}

    def load_file_once(self: loaders.JSONFileLoader, file_path: str) -> Any:
        if file_path not in parsed:
            parsed[file_path] = load(self, file_path)
        return parsed[file_path]

    loaders.JSONFileLoader.load_file = load_file_once


def _list_moto_modules_once() -> None:
    """moto's server finds a request's service by listing its own package directory on every
    request (`moto.backends.list_of_moto_modules`: a listdir and a stat for each of its hundreds of
    modules, a quarter of the server's CPU). That list does not change while it runs: it is listed
    once, and every request is answered from the same list."""
    import moto.backends as backends

    if getattr(backends.list_of_moto_modules, "__name__", "") == "listed_once":
        return
    modules = tuple(backends.list_of_moto_modules())

    def listed_once() -> tuple[str, ...]:
        return modules

    backends.list_of_moto_modules = listed_once


def _atomic_key_requests_once() -> None:
    """S3 applies each request to an object atomically: of two racing `If-None-Match: *` PUTs exactly
    one wins. moto's server answers requests in threads and checks a condition, then stores,
    without a lock: two racers can both win (and one's write closes the buffer the other reads).
    Here one request to an object is answered at a time (listings and bucket requests still run side
    by side), as S3 would order them; what a test races is its clients, never the store's atomicity."""
    import threading

    from moto.s3.responses import S3Response

    answer = S3Response._key_response
    if getattr(answer, "__name__", "") == "one_at_a_time":
        return
    lock = threading.Lock()

    def one_at_a_time(self: S3Response, request: Any, full_url: str) -> Any:
        with lock:
            return answer(self, request, full_url)

    S3Response._key_response = one_at_a_time  # type: ignore[method-assign]


def _quick_stop() -> type:
    """moto's ThreadedMotoServer serving with a short poll_interval: `stop()` returns at once, not after
    up to half a second (its serve_forever looks for `shutdown()` every poll_interval, 0.5 s by default)."""
    from moto.server import DomainDispatcherApplication, ThreadedMotoServer, create_backend_app
    from werkzeug.serving import make_server

    class QuickStop(ThreadedMotoServer):
        def _server_entry(self) -> None:  # moto's own, but for serve_forever's poll_interval
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(self._ip_address, self._port, app, True)
            self._server_ready_event.set()
            self._server.serve_forever(poll_interval=0.02)

    return QuickStop


@contextmanager
def moto_s3(ip: str = "127.0.0.1", port: int = 0) -> Iterator[S3]:
    """A moto server on ip:port (0: any free port) with one fresh bucket; stopped on exit."""
    import logging

    import boto3

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request on stderr
    _list_moto_modules_once()
    _atomic_key_requests_once()
    os.environ.update(CREDS)
    srv = _quick_stop()(ip_address=ip, port=port, verbose=False)
    srv.start()
    try:
        host, real_port = srv.get_host_and_port()
        endpoint = f"http://{host}:{real_port}"
        bucket = f"sweep-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield S3(endpoint, bucket)
    finally:
        srv.stop()


HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")


class FaultProxy:
    """A real HTTP proxy in front of a store, with the faults of real ones: `drop` headers it never
    passes on (a store that ignores conditional writes), `slowdown` requests answered 503 SlowDown
    before it passes any on (a throttling store), `down` (connections refused: an outage), `stall`
    a request whose path holds that text never passed on nor answered until the proxy closes (an
    upload under way, however small its file; `stalled` is set once one came).
    `endpoint` is its URL; `seen` counts the requests that reached it."""

    def __init__(self, upstream: str, drop: set[str] | None = None, ip: str = "127.0.0.1") -> None:
        import http.server
        import threading

        self.upstream, self.drop, self.ip = upstream, {h.lower() for h in drop or ()}, ip
        self.slowdown = 0
        self.stall: str | None = None
        self.stalled, self._closed = threading.Event(), threading.Event()
        self.seen = 0
        self.counts: dict[str, int] = {}  # requests by S3's price classes: PUT, GET, HEAD, LIST, DELETE
        self.lock = threading.Lock()
        self._srv: http.server.ThreadingHTTPServer | None = None
        self.port = 0
        self.up()

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.port}"

    def up(self) -> None:
        import http.server
        import threading

        srv = http.server.ThreadingHTTPServer((self.ip, self.port), _handler(self))
        srv.daemon_threads = True
        self.port = srv.server_address[1]
        self._srv = srv
        # serve_forever looks for `shutdown()` every poll_interval (0.5 s by default): each `down()`
        # and `close()` waited that long for it
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def down(self) -> None:
        if self._srv is not None:
            self._srv.shutdown()
            self._srv.server_close()
            self._srv = None

    def close(self) -> None:
        self._closed.set()  # a stalled request's connection is dropped, unanswered
        self.down()


def _handler(proxy: FaultProxy) -> type:
    import http.client
    import http.server
    from urllib.parse import urlsplit

    target = urlsplit(proxy.upstream)

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status, reason)
            length = str(len(data))
            for k, v in headers:
                if k.lower() == "content-length" and self.command == "HEAD":
                    length = v  # a HEAD's is the object's, not its (empty) body's
                elif k.lower() not in HOP | {"content-length"}:
                    self.send_header(k, v)
            self.send_header("Content-Length", length)
            self.send_header("Connection", "close")  # no connection outlives `down()`
            self.close_connection = True
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _forward(self) -> None:
            body = self._body()
            kind = ("LIST" if self.command == "GET" and "list-type=" in self.path else
                    "PUT" if self.command in ("PUT", "POST") else self.command)
            with proxy.lock:
                proxy.seen += 1
                proxy.counts[kind] = proxy.counts.get(kind, 0) + 1
                throttled = proxy.slowdown > 0
                if throttled:
                    proxy.slowdown -= 1
            if throttled:
                self._reply(503, "Slow Down", [("Content-Type", "application/xml")], SLOWDOWN)
                return
            if proxy.stall is not None and proxy.stall in self.path:
                proxy.stalled.set()
                proxy._closed.wait()
                self.close_connection = True
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in proxy.drop | HOP}
            headers["Content-Length"] = str(len(body))
            conn = http.client.HTTPConnection(target.hostname or "", target.port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
            finally:
                conn.close()
            self._reply(r.status, r.reason, r.getheaders(), data)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        def log_message(self, *args: object) -> None:
            pass

    return Forward
