"""doctor's self-test of the sweep's object store, against a real S3 HTTP endpoint (moto's server):
a good store passes every check and is left as it was; a store that ignores conditional headers
(moto behind a real HTTP proxy that drops `If-None-Match` and `If-Match`) is refused, naming it; an
unreachable store, a missing bucket and missing credentials each fail fast in one line with the fix."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from ablate.doctor.store import store_checks
from tests.helpers.s3 import S3, FaultProxy, quick_backoff

NAMES = ["store", "store_create", "store_replace", "store_list", "store_cleanup"]


def _url(s3: S3) -> str:
    return s3.url(f"t/{uuid.uuid4().hex[:8]}/ablate/sw")


def _keys(s3: S3, url: str) -> list[str]:
    prefix = url.split("/", 3)[3]
    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    return [o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents") or ()]


@pytest.fixture
def deaf_store(s3: S3) -> Iterator[str]:
    """The endpoint of a store that ignores conditional writes: moto behind a proxy that strips
    If-None-Match and If-Match from every request."""
    proxy = FaultProxy(s3.endpoint, drop={"if-none-match", "if-match"})
    yield proxy.endpoint
    proxy.close()


def test_a_store_with_conditional_writes_passes_and_is_left_as_it_was(s3: S3) -> None:
    url = _url(s3)
    checks = store_checks(url, s3.endpoint)
    assert [c.check for c in checks] == NAMES
    assert all(c.ok for c in checks), checks
    assert s3.endpoint in checks[0].reason and url in checks[0].reason
    assert "412" in checks[1].reason and "412" in checks[2].reason
    assert _keys(s3, url) == [], "the scratch keys are removed"


def test_the_proxy_is_transparent_but_for_the_conditional_headers(s3: S3, deaf_store: str) -> None:
    """What makes the next test mean something: everything else reaches moto intact, signatures too."""
    url = _url(s3)
    client = boto3.client("s3", endpoint_url=deaf_store, region_name="us-east-1")
    key = url.split("/", 3)[3] + "/probe"
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"one")
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"one"
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"two", IfNoneMatch="*")  # stripped: accepted
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"two"
    direct = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    with pytest.raises(direct.exceptions.ClientError) as ei:  # moto itself enforces it
        direct.put_object(Bucket=s3.bucket, Key=key, Body=b"three", IfNoneMatch="*")
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    client.delete_object(Bucket=s3.bucket, Key=key)


def test_a_store_that_ignores_conditional_headers_is_refused_naming_it(s3: S3, deaf_store: str) -> None:
    url = _url(s3)
    checks = {c.check: c for c in store_checks(url, deaf_store)}
    assert list(checks) == NAMES
    assert checks["store"].ok and checks["store_list"].ok and checks["store_cleanup"].ok
    create, replace = checks["store_create"], checks["store_replace"]
    assert not create.ok and not replace.ok
    for needle in (deaf_store, url, "IGNORES If-None-Match", "claims would not be exclusive",
                   "use a store with conditional writes: AWS S3, R2, B2, MinIO ≥ 2024-11, GCS"):
        assert needle in create.reason, (needle, create.reason)
    assert "IGNORES If-Match" in replace.reason and deaf_store in replace.reason
    assert "\n" not in create.reason + replace.reason
    assert _keys(s3, url) == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_store_fails_fast_alone_naming_the_endpoint(
        s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    quick_backoff(monkeypatch)  # botocore's tries at the closed port, shorter apart
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    checks = store_checks("s3://sweep-bucket/p/ablate/sw", endpoint, wait=1)
    assert time.monotonic() - t0 < 20
    assert [(c.check, c.ok) for c in checks] == [("store", False)]
    assert endpoint in checks[0].reason and "did not answer" in checks[0].reason
    assert "storage_endpoint" in checks[0].reason and "\n" not in checks[0].reason


def test_a_missing_bucket_is_named_with_the_fix(s3: S3) -> None:
    checks = store_checks("s3://no-such-bucket-here/p/ablate/sw", s3.endpoint, wait=1)
    assert [(c.check, c.ok) for c in checks] == [("store", False)]
    assert "no such bucket 'no-such-bucket-here'" in checks[0].reason and "storage:" in checks[0].reason


def test_missing_credentials_point_at_the_aws_chain(s3: S3, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    checks = store_checks(_url(s3), s3.endpoint, wait=1)
    assert [(c.check, c.ok) for c in checks] == [("store", False)]
    assert "AWS chain" in checks[0].reason and "AWS_ACCESS_KEY_ID" in checks[0].reason
