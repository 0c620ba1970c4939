"""The sweep's state in an S3-compatible object store (`storage: s3://BUCKET/PREFIX`): the few
operations its guarantees rest on, over boto3 (imported when a `Store` is made, so that this module
stays stdlib-only at import like the rest of the runner's package).

- `create`: a conditional create (`If-None-Match: *`): exactly one writer gets the key (a claim, a
  result's commit, an immutable wrapper). None when it was there.
- `replace`: a conditional replace (`If-Match: <etag>`): only the version read is replaced (a
  takeover, an event appended by read-modify-write). None when the object changed since.
- `delete_if`: a conditional delete (`If-Match`): a lease let go only while it is still ours.
- `put`, `get`, `head`, `list`, `children`, `delete`, `upload`, `download`: the plain operations.

Keys are relative to the store's prefix. Times are the store's own clock (`LastModified`, whole
seconds on AWS): hosts' clocks disagree, as with a shared FS's mtimes.

Failures. botocore's "standard" retry mode retries a throttle (503 SlowDown, 429), a 5xx and a lost
connection with exponential backoff; past its attempts (seen under boto3's transfer wrappers too:
`S3UploadFailedError`, `RetriesExceededError`), an unreachable or failing store is waited
out here like a shared FS's outage (`ABLATE_FS_WAIT` seconds, default 900), then `StoreDown`. A
conditional write that was retried may have landed the first time and fail the second with 412:
`create` and `replace` then read the object back, and when it holds exactly the bytes this call
wrote (each writer's bytes are its own: a host, a queue, a time), the write is this call's.
Credentials come from the standard AWS chain (environment, shared config, instance role); nothing
here writes or logs them.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

# Seconds an outage is waited out before a write gives up: a shared FS's (wrappers/common.sh
# `fs_wait`, which reads it from the run spec: ablate/run/placement.py) and a store's alike; env
# ABLATE_FS_WAIT in the runner's process. Defined here: the boot program ships this module alone.
FS_WAIT = 900.0

SCHEME = "s3://"
# The codes that say "the condition did not hold": 412 PreconditionFailed, and 409
# ConditionalRequestConflict (AWS: a concurrent conditional write to the same key; retry it).
_PRECONDITION = {"PreconditionFailed", "412"}
_CONFLICT = {"ConditionalRequestConflict", "409", "OperationAborted"}
_MISSING = {"NoSuchKey", "404", "NotFound"}
_TRANSIENT = {"SlowDown", "Throttling", "RequestTimeout", "RequestTimeTooSkewed", "InternalError"}
# botocore's errors that no wait mends: the fix is the user's
_FOR_GOOD = {"NoCredentialsError", "PartialCredentialsError", "ParamValidationError", "NoRegionError",
             "InvalidS3AddressingStyleError"}


class StoreError(Exception):
    """A store operation failed for good: bad credentials, no such bucket, a refused request."""


class StoreDown(StoreError):
    """The store did not answer (or kept failing) for longer than the outage wait."""


class Obj:
    """One object as a listing or a HEAD gives it: key (relative), etag, size, mtime (the store's
    clock, epoch seconds)."""

    __slots__ = ("etag", "key", "mtime", "size")

    def __init__(self, key: str, etag: str, size: int, mtime: float) -> None:
        self.key, self.etag, self.size, self.mtime = key, etag, size, mtime

    def __repr__(self) -> str:
        return f"Obj({self.key!r}, {self.etag!r}, {self.size}, {self.mtime})"


class Got(Obj):
    """An object read whole: `Obj` plus its bytes."""

    __slots__ = ("data",)

    def __init__(self, key: str, etag: str, data: bytes, mtime: float) -> None:
        super().__init__(key, etag, len(data), mtime)
        self.data = data


def parse_url(url: str) -> tuple[str, str]:
    """`s3://BUCKET/PREFIX` -> (bucket, prefix without slashes at either end). ValueError naming the
    problem when it is not one."""
    if not url.startswith(SCHEME):
        raise ValueError(f"{url!r} is not an s3:// URL; write s3://BUCKET/PREFIX")
    bucket, _, prefix = url[len(SCHEME):].partition("/")
    if not (3 <= len(bucket) <= 63) or not all(c.islower() or c.isdigit() or c in ".-" for c in bucket) \
            or not bucket[0].isalnum() or not bucket[-1].isalnum():
        raise ValueError(f"{url!r}: {bucket!r} is not a bucket name (3-63 of a-z 0-9 . -, starting "
                         f"and ending with a letter or digit)")
    prefix = prefix.strip("/")
    for part in prefix.split("/") if prefix else ():
        if part in ("", ".", "..") or any(ord(c) < 32 or c == "\\" for c in part):
            raise ValueError(f"{url!r}: the prefix {prefix!r} has an empty, '.', '..' or control "
                             f"part; give plain names separated by /")
    return bucket, prefix


def _etag(raw: Any) -> str:
    return str(raw or "").strip('"')


def _code(e: BaseException) -> str:
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        err = resp.get("Error") or {}
        code = str(err.get("Code") or "")
        status = str((resp.get("ResponseMetadata") or {}).get("HTTPStatusCode") or "")
        return code or status
    return ""


def _status(e: BaseException) -> int:
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        try:
            return int((resp.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
        except (TypeError, ValueError):
            return 0
    return 0


def _unwrapped(e: BaseException) -> BaseException:
    """The botocore error under boto3's transfer wrappers: `upload_file` turns a ClientError (a
    throttle, a 5xx) into `S3UploadFailedError` (the ClientError its context), `download_file` a lost
    connection into `RetriesExceededError` (it in `last_exception`). Anything else as it came."""
    if type(e).__name__ == "S3UploadFailedError" and e.__context__ is not None:
        return e.__context__
    last = getattr(e, "last_exception", None)
    if type(e).__name__ == "RetriesExceededError" and isinstance(last, BaseException):
        return last
    return e


class Store:
    """One bucket and prefix. `endpoint`: a non-AWS endpoint's URL (R2, B2, MinIO, GCS's XML API),
    reached path-style. `wait`: seconds an unreachable store is waited out (default ABLATE_FS_WAIT,
    else FS_WAIT). `attempts`: botocore's attempts per request before that wait takes over. `pause`:
    the first of that wait's pauses between tries (each next one twice as long, at most 15 s)."""

    def __init__(self, url: str, endpoint: str | None = None, *, wait: float | None = None,
                 attempts: int = 5, timeout: float = 30.0, pause: float = 1.0) -> None:
        import boto3  # what the store needs, imported only where a store is used
        from botocore.config import Config

        self.url = url
        self.bucket, self.prefix = parse_url(url)
        self.endpoint = endpoint or None
        if wait is None:
            try:
                wait = float(os.environ.get("ABLATE_FS_WAIT", FS_WAIT))
            except ValueError:
                wait = FS_WAIT
        self.wait, self.pause = wait, pause
        self.requests: dict[str, int] = {}  # per operation, for the benchmarks and `--verbose`
        self.last_date: float | None = None  # the store's `Date` at the last listing (its clock)
        # A non-AWS endpoint: path-style addresses. Checksums as botocore's own settings say (its
        # default since 1.36 sends uploads with a trailing CRC; a store that refuses that takes
        # AWS_REQUEST_CHECKSUM_CALCULATION=when_required, which launch hands the queues too).
        cfg = Config(retries={"mode": "standard", "max_attempts": attempts},
                     connect_timeout=min(timeout, 10.0), read_timeout=timeout,
                     s3={"addressing_style": "path"} if self.endpoint else None,
                     user_agent_extra="ablate")
        session = boto3.session.Session()
        region = session.region_name or ("us-east-1" if self.endpoint else None)
        self.client = session.client("s3", endpoint_url=self.endpoint, region_name=region, config=cfg)
        self._errors = self.client.exceptions

    # ------------------------------------------------------------------ keys

    def key(self, rel: str) -> str:
        rel = rel.lstrip("/")
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def rel(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    def where(self, rel: str = "") -> str:
        """The s3:// URL of a key, for messages."""
        return f"s3://{self.bucket}/{self.key(rel)}"

    # ------------------------------------------------------------------ the retry loop

    def _call(self, op: str, rel: str, fn: Callable[[], Any]) -> Any:
        """fn() with an unreachable or failing store waited out (after botocore's own retries):
        StoreDown past the wait; StoreError for a refusal that waiting cannot mend. ClientErrors of
        the conditions (412, 409, 404) pass through to the caller."""
        deadline = time.monotonic() + self.wait
        pause = self.pause
        while True:
            self.requests[op] = self.requests.get(op, 0) + 1
            try:
                return fn()
            except Exception as raised:
                why = self._passing(op, rel, raised)
            if time.monotonic() + pause > deadline:
                raise StoreDown(f"{op} {self.where(rel)}: the store did not answer for {self.wait:.0f} s "
                                f"({why}); is {self.endpoint or 'S3'} reachable?")
            time.sleep(pause)
            pause = min(pause * 2, 15.0)

    def _passing(self, op: str, rel: str, raised: Exception) -> str:
        """What failed, when waiting may mend it (a throttle, a 5xx, no connection); raised again
        as it came when it is a condition or not the store's; StoreError for a refusal."""
        from botocore.exceptions import BotoCoreError, ClientError

        e = _unwrapped(raised)
        if isinstance(e, ClientError):
            code, status = _code(e), _status(e)
            if self._condition(e) and code != "NoSuchBucket":  # no bucket is no condition
                raise e
            if status < 500 and code not in _TRANSIENT:
                msg = (e.response.get("Error") or {}).get("Message", "")
                raise StoreError(f"{op} {self.where(rel)}: {code or status}: {msg}".rstrip(": ")) from e
            return f"{code or status}"
        if isinstance(e, BotoCoreError):  # no connection, a time-out, a broken read
            if type(e).__name__ in _FOR_GOOD:
                raise StoreError(f"{op} {self.where(rel)}: {e}") from e
            return type(e).__name__
        raise raised

    # ------------------------------------------------------------------ conditional writes

    def create(self, rel: str, data: bytes) -> str | None:
        """Create `rel` unless it exists: its etag, or None when it was there (412; or it holds
        other bytes after a retried create)."""
        return self._conditional(rel, data, IfNoneMatch="*")

    def replace(self, rel: str, data: bytes, etag: str) -> str | None:
        """Replace `rel` only if its etag is still `etag`: the new etag, or None when it changed (or
        is gone) since it was read."""
        return self._conditional(rel, data, IfMatch=f'"{etag}"')

    def _conditional(self, rel: str, data: bytes, **condition: str) -> str | None:
        """A put under `condition`: its etag, or None when the condition did not hold, unless the
        object holds exactly `data` (this call's own write, retried after it landed)."""
        try:
            r = self._call("put", rel, lambda: self.client.put_object(
                Bucket=self.bucket, Key=self.key(rel), Body=data, **condition))
            return _etag(r.get("ETag"))
        except Exception as e:
            if not self._condition(e):
                raise
        got = self.get(rel)
        return got.etag if got is not None and got.data == data else None

    def _condition(self, e: BaseException) -> bool:
        """True when `e` says a condition did not hold (412, 409 conflict, 404 of an If-Match)."""
        from botocore.exceptions import ClientError

        if not isinstance(e, ClientError):
            return False
        code, status = _code(e), _status(e)
        return code in _PRECONDITION or code in _CONFLICT or code in _MISSING or status in (404, 409, 412)

    def append(self, rel: str, line: bytes, *, known: tuple[str, bytes] | None = None,
               tries: int = 50) -> tuple[str, bytes]:
        """Append `line` to the object `rel` by a conditional read-modify-write (S3 cannot append):
        never lost, never twice, never reordered against another writer's append. `known`: the
        object as this writer last left it, (etag, bytes) or ("", b"") for none: no read first
        while it still is. A `line` the object already ends with is not appended again (this
        writer's own append, whose answer was lost). The object as it is now, (etag, bytes)."""
        for _ in range(tries):
            if known is None:
                got = self.get(rel)
                known = (got.etag, got.data) if got is not None else ("", b"")
            etag, have = known
            if have.endswith(line):
                return known
            body = have + line
            new = self.replace(rel, body, etag) if etag else self.create(rel, body)
            if new is not None:
                return new, body
            known = None  # another writer got there first: read again
        raise StoreError(f"append to {self.where(rel)}: {tries} writers in a row got there first")

    # ------------------------------------------------------------------ plain operations

    def put(self, rel: str, data: bytes) -> str:
        r = self._call("put", rel, lambda: self.client.put_object(
            Bucket=self.bucket, Key=self.key(rel), Body=data))
        return _etag(r.get("ETag"))

    def get(self, rel: str) -> Got | None:
        try:
            r = self._call("get", rel, lambda: self._get_whole(rel))
        except Exception as e:
            if _code(e) in _MISSING or _status(e) == 404:
                return None
            raise
        return r  # type: ignore[no-any-return]

    def _get_whole(self, rel: str) -> Got:
        r = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))
        data = r["Body"].read()  # inside the retry: a connection cut mid-body is read again
        return Got(rel, _etag(r.get("ETag")), data, r["LastModified"].timestamp())

    def get_range(self, rel: str, start: int) -> bytes | None:
        """The bytes of `rel` from offset `start` on (None when it is gone; b"" when no more)."""
        try:
            r = self._call("get", rel, lambda: self.client.get_object(
                Bucket=self.bucket, Key=self.key(rel), Range=f"bytes={start}-")["Body"].read())
        except Exception as e:
            if _code(e) in _MISSING or _status(e) == 404:
                return None
            if _code(e) == "InvalidRange" or _status(e) == 416:
                return b""
            raise
        return r  # type: ignore[no-any-return]

    def head(self, rel: str) -> Obj | None:
        try:
            r = self._call("head", rel, lambda: self.client.head_object(
                Bucket=self.bucket, Key=self.key(rel)))
        except Exception as e:
            if _code(e) in _MISSING or _status(e) == 404:
                return None
            raise
        return Obj(rel, _etag(r.get("ETag")), int(r.get("ContentLength") or 0), r["LastModified"].timestamp())

    def children(self, rel_dir: str) -> list[str]:
        """The immediate child names under the "directory" `rel_dir` (objects and common prefixes
        one `/` below it, by a delimited listing), sorted; [] when there are none."""
        base = rel_dir.strip("/")
        prefix = self.key(base) + "/" if base else (self.prefix + "/" if self.prefix else "")
        names: set[str] = set()
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/"}
            if token:
                kw["ContinuationToken"] = token
            r = self._call("list", rel_dir, functools.partial(self.client.list_objects_v2, **kw))
            names.update(o["Key"][len(prefix):] for o in r.get("Contents") or ())
            names.update(p["Prefix"][len(prefix):].rstrip("/") for p in r.get("CommonPrefixes") or ())
            token = r.get("NextContinuationToken") if r.get("IsTruncated") else None
            if not token:
                return sorted(n for n in names if n)

    def any_under(self, rel_prefix: str) -> bool:
        """Whether any object's relative key starts with `rel_prefix` (one listing of one key)."""
        r = self._call("list", rel_prefix, lambda: self.client.list_objects_v2(
            Bucket=self.bucket, Prefix=self.key(rel_prefix), MaxKeys=1))
        return bool(r.get("Contents"))

    def list(self, rel_prefix: str = "") -> list[Obj]:
        """Every object under `rel_prefix` (a plain string prefix of the relative keys), sorted."""
        return sorted(self._list(rel_prefix), key=lambda o: o.key)

    def _list(self, rel_prefix: str) -> Iterator[Obj]:
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.key(rel_prefix) if rel_prefix
                                  else (self.prefix + "/" if self.prefix else "")}
            if token:
                kw["ContinuationToken"] = token
            r = self._call("list", rel_prefix, functools.partial(self.client.list_objects_v2, **kw))
            self.last_date = http_date((r.get("ResponseMetadata") or {}).get("HTTPHeaders", {}).get("date"))
            for o in r.get("Contents") or ():
                yield Obj(self.rel(o["Key"]), _etag(o.get("ETag")), int(o.get("Size") or 0),
                          o["LastModified"].timestamp())
            token = r.get("NextContinuationToken") if r.get("IsTruncated") else None
            if not token:
                return

    def delete(self, rel: str) -> None:
        self._call("delete", rel, lambda: self.client.delete_object(Bucket=self.bucket, Key=self.key(rel)))

    def delete_if(self, rel: str, etag: str) -> bool:
        """Delete `rel` only while its etag is still `etag` (`If-Match`): False when it changed or is
        gone. A store that does not implement conditional deletes (501) gets a plain delete: the
        caller read the etag just before, which is all such a store allows."""
        from botocore.exceptions import ClientError

        def attempt() -> None:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self.key(rel), IfMatch=f'"{etag}"')
            except ClientError as e:
                if _code(e) != "NotImplemented" and _status(e) != 501:
                    raise
                self.client.delete_object(Bucket=self.bucket, Key=self.key(rel))

        try:
            self._call("delete", rel, attempt)
        except Exception as e:
            if self._condition(e):
                return False
            raise
        return True

    def copy(self, src: str, dst: str) -> str | None:
        """Copy `src` to `dst` unless `dst` exists (the copy's condition): its etag, or None when
        `dst` was there (small objects: claims, records)."""
        got = self.get(src)
        if got is None:
            raise StoreError(f"copy {self.where(src)}: no such object")
        return self.create(dst, got.data)

    def upload(self, rel: str, path: str, on_bytes: Callable[[int], None] | None = None) -> None:
        """A local file to `rel`, in parts in parallel for a large one: boto3's transfer manager as
        it comes (64 MB parts measured 0.61x its own speed: docs/BENCHMARKS.md)."""
        self._call("upload", rel, lambda: self.client.upload_file(
            path, self.bucket, self.key(rel), Callback=on_bytes))

    def download(self, rel: str, path: str, on_bytes: Callable[[int], None] | None = None) -> int:
        """`rel` to a local file (created or truncated); its size. StoreError when there is none."""
        from boto3.s3.transfer import TransferConfig

        cfg = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=8)
        try:
            self._call("download", rel, lambda: self.client.download_file(
                self.bucket, self.key(rel), path, Config=cfg, Callback=on_bytes))
        except Exception as e:
            if _code(e) in _MISSING or _status(e) == 404:
                raise StoreError(f"download {self.where(rel)}: no such object") from e
            raise
        return os.path.getsize(path)

    def now(self) -> float:
        """The store's clock: a small object written and its LastModified read."""
        self.put(".clock", b"")
        got = self.head(".clock")
        if got is None:
            raise StoreError(f"{self.where('.clock')}: written, then not found: the store does not read "
                             f"its own writes")
        return got.mtime


def http_date(value: object) -> float | None:
    """An HTTP `Date` header as epoch seconds (None when absent or unreadable)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        import email.utils  # here: ~3 ms off every command that loads a config

        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
