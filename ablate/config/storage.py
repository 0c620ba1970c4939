"""Where a profile keeps the sweep's state: `shared_fs:` (a mount every instance shares) or
`storage:` (an S3-compatible bucket, for platforms with no shared FS), and the instance-local
`ckpt_root:`.

    storage: s3://my-bucket/ablate-sweeps    # the sweep's state under s3://my-bucket/ablate-sweeps/ablate/<sweep>/
    storage_endpoint: https://ACCOUNT.r2.cloudflarestorage.com   # a non-AWS store; absent: AWS S3
    ckpt_root: /root/ablate-ckpt             # the checkpoints, and each instance's copy of the sweep

A profile gives exactly one of `shared_fs` and `storage`. With `storage`, the profile's `shared_fs`
field is the instance-local parent of the sweep's local copy, `<ckpt_root>/.ablate` (a dot name: a
cell's directory `<ckpt_root>/<name>/` can never be it), so that everything that asks a host where
its sweep root is gets a directory on that host's own disk. Only ssh hosts use a store: a local
profile's FS is a directory here, and a Slurm cluster has its shared FS.

Credentials never go in a profile: the controller takes them from the standard AWS chain, so an
endpoint with `user:password@` or a query string is refused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from ablate.config.reader import Reader
from ablate.remote.store.client import SCHEME, parse_url

SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+@,=~-]+$")
LOCAL_COPY = ".ablate"  # <ckpt_root>/.ablate/<sweep>: an instance's copy of a store's sweep
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.?)+$|^\[[0-9A-Fa-f:.]+\]$")
_URL_PATH = re.compile(r"^[A-Za-z0-9._/~-]*$")
_CREDENTIALS = ("credentials never go in ablate.yaml; use the AWS chain (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY in the environment, ~/.aws/credentials, or AWS_PROFILE)")
_STORES = "any S3-compatible bucket with conditional writes: AWS S3, R2, B2, MinIO, GCS"


class Keeper(Protocol):
    """What `one_place` reads of a profile (`Profile` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def shared_fs(self) -> str: ...
    @property
    def storage(self) -> str | None: ...
    @property
    def storage_endpoint(self) -> str | None: ...


@dataclass(frozen=True)
class Place:
    """What a profile says about where things are; `shared_fs` as `Profile.shared_fs` holds it."""

    shared_fs: str
    ckpt_root: str
    storage: str | None  # s3://BUCKET[/PREFIX], normalised: no slash at its end
    endpoint: str | None  # http(s)://HOST[:PORT][/PATH], no slash at its end


def local_path(p: str, base: Path) -> str:
    expanded = Path(os.path.expanduser(p))
    return str(expanded if expanded.is_absolute() else (base / expanded).resolve())


def parse_place(r: Reader, transport: str, project_dir: Path) -> Place:
    """`shared_fs` or `storage` (exactly one), `storage_endpoint`, `ckpt_root` of the profile `r`."""
    shared, storage = r.text("shared_fs"), r.text("storage")
    if shared is not None and storage is not None:
        raise r.err("storage", "give either shared_fs (a mount every instance shares) or storage (an "
                               "s3:// bucket, for instances that share no filesystem), not both")
    if shared is None and storage is None:
        raise r.err("shared_fs", "is required: give shared_fs: /PATH (a mount every instance shares) or "
                                 "storage: s3://BUCKET/PREFIX (an S3-compatible bucket, no shared FS)")
    ckpt = r.text("ckpt_root", required=True) or ""
    endpoint = r.text("storage_endpoint")
    if endpoint is not None and storage is None:
        raise r.err("storage_endpoint", "needs storage: s3://BUCKET/PREFIX (the bucket on that endpoint); "
                                        "a shared_fs profile has no endpoint")
    if storage is not None and transport != "ssh":
        where = "a directory on this machine" if transport == "local" else "the cluster's shared FS"
        raise r.err("storage", f"works only with transport: ssh (instances that share no filesystem); "
                               f"a {transport} profile keeps the sweep in {where}: give shared_fs instead")
    if transport == "local":
        shared, ckpt = local_path(shared or "", project_dir), local_path(ckpt, project_dir)
    else:
        for key, val in (("shared_fs", shared), ("ckpt_root", ckpt)):
            if val is not None and not val.startswith("/"):
                raise r.err(key, f"must be an absolute path on the instances, got {val!r}")
    for key, val in (("shared_fs", shared), ("ckpt_root", ckpt)):
        if val is not None and not SAFE_PATH.match(val.replace("{host}", "h")):
            raise r.err(key, f"{val!r} has characters a shell would interpret; use plain paths")
    ckpt = ckpt.rstrip("/") or "/"
    if storage is None:
        return Place((shared or "").rstrip("/") or "/", ckpt, None, None)
    return Place(f"{ckpt.rstrip('/')}/{LOCAL_COPY}", ckpt, storage_url(r, storage),
                 None if endpoint is None else endpoint_url(r, endpoint))


def storage_url(r: Reader, raw: str) -> str:
    """`storage:` checked (a bucket name, a plain prefix) and normalised to s3://BUCKET[/PREFIX]."""
    try:
        bucket, prefix = parse_url(raw.strip())
    except ValueError as e:
        raise r.err("storage", f"{e} ({_STORES})") from None
    if prefix and not SAFE_PATH.match(prefix):
        raise r.err("storage", f"the prefix {prefix!r} has characters a shell would interpret; use "
                               f"letters, digits and . _ / + @ , = ~ -")
    return f"{SCHEME}{bucket}/{prefix}" if prefix else f"{SCHEME}{bucket}"


def endpoint_url(r: Reader, raw: str) -> str:
    """`storage_endpoint:` as http(s)://HOST[:PORT][/PATH]: no credentials, no query, no fragment."""
    text = raw.strip()
    form = "must be http(s)://HOST[:PORT][/PATH], e.g. https://ACCOUNT.r2.cloudflarestorage.com"
    u = urlsplit(text)
    if "@" in text or "?" in text:  # checked first: what follows may echo the text
        raise r.err("storage_endpoint", f"{u.scheme or '…'}://{u.hostname or '…'}/… holds a user, password "
                                        f"or query: {_CREDENTIALS}")
    if u.scheme not in ("http", "https") or not u.netloc:
        raise r.err("storage_endpoint", f"{form}; got {raw!r}")
    if u.fragment or "#" in text:
        raise r.err("storage_endpoint", f"{form}; drop the #fragment")
    host = u.netloc.rsplit(":", 1)[0] if not u.netloc.endswith("]") else u.netloc
    try:
        port = u.port
    except ValueError:
        port = -1
    if port == -1 or not _HOST.match(host) or not _URL_PATH.match(u.path):
        raise r.err("storage_endpoint", f"{form}; got {raw!r}")
    return text.rstrip("/")


def one_place(h: Reader, default: Keeper, other: Keeper, transport: str) -> None:
    """Refuse host `h` (profile `other`, `transport`) unless it keeps the sweep where the default
    profile does: both in one store, or both on a shared FS. One sweep lives in one place: its
    claims and results nowhere else."""
    if other.storage and transport != "ssh":
        raise h.err("transport", f"profile {other.name} keeps the sweep in {other.storage}, which only ssh "
                                 f"hosts use; drop transport: {transport}, or give this host a shared_fs "
                                 f"profile")
    if default.storage == other.storage and default.storage_endpoint == other.storage_endpoint:
        return

    def place(p: Keeper) -> str:
        if p.storage is None:
            return f"on the shared FS {p.shared_fs}"
        return f"in {p.storage}" + (f" at {p.storage_endpoint}" if p.storage_endpoint else "")

    raise h.err("profile", f"profile {other.name} keeps the sweep {place(other)}, but the top-level profile "
                           f"{default.name} {place(default)}; one sweep lives in one place: give every "
                           f"host a profile with the same storage (the top-level `profile:` names it)")
