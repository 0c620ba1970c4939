"""A real S3 HTTP endpoint on this machine: moto in server mode (it enforces conditional writes:
`If-None-Match: *` and `If-Match`), one bucket, and the fake credentials the clients use."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CREDS = {"AWS_ACCESS_KEY_ID": "AKIAABLATETEST000001", "AWS_SECRET_ACCESS_KEY": "ablate-test-secret-0123456789",
         "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")


@contextmanager
def moto_s3(ip: str = "127.0.0.1", port: int = 0) -> Iterator[S3]:
    """A moto server on ip:port (0: any free port) with one fresh bucket; stopped on exit."""
    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.update(CREDS)
    srv = ThreadedMotoServer(ip_address=ip, port=port, verbose=False)
    srv.start()
    try:
        host, real_port = srv.get_host_and_port()
        endpoint = f"http://{host}:{real_port}"
        bucket = f"sweep-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield S3(endpoint, bucket)
    finally:
        srv.stop()
