"""doctor's self-test of a sweep's object store (`storage:`): the store must really do what the
sweep's guarantees rest on, tested on scratch keys under the sweep's prefix
(`.doctor/<random>/...`, removed afterwards):

- `store`: reachable, the credentials accepted, the bucket there and writable (a plain PUT);
- `store_create`: a conditional create (`If-None-Match: *`) of a new key succeeds and a second one,
  of other bytes, fails with 412 leaving the first bytes: a store that accepts it ignores the
  header, and claims would not be exclusive there;
- `store_replace`: `If-Match` with a stale ETag fails with 412, with the current one succeeds
  (a takeover replaces only the version it read);
- `store_list`: a listing right after the writes shows them all (list-after-write);
- `store_cleanup`: the scratch keys are deleted and gone from the listing.

The conditional writes go to the client directly, not through `Store.create` / `Store.replace`:
those read a key back after a 412 and take identical bytes for their own retried write, which is
right for a claim and would hide a store that ignores the header. Every write here carries bytes of
its own. Nothing here reads, writes or prints the credentials.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping

from ablate.config.project import Host, Project
from ablate.errors import AblateError
from ablate.remote.store.client import Store, StoreDown, StoreError
from ablate.run.refusals import Check
from ablate.run.store_launch import BootPlan, boot, creds_note
from ablate.transport import HostTransport

GOOD_STORES = "AWS S3, R2, B2, MinIO ≥ 2024-11, GCS"
CHAIN = ("the AWS chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment, "
         "~/.aws/credentials, or AWS_PROFILE")
SCRATCH = ".doctor"


class _Failed(Exception):
    """One step's failure: its check's reason."""


def _error(e: BaseException) -> tuple[int, str]:
    """(HTTP status, `Code: message`) of a botocore error; (0, its text) of anything else."""
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        err, meta = resp.get("Error") or {}, resp.get("ResponseMetadata") or {}
        try:
            status = int(meta.get("HTTPStatusCode") or err.get("Code") or 0)
        except (TypeError, ValueError):
            status = 0
        text = ": ".join(str(x) for x in (err.get("Code"), err.get("Message")) if x)
        return status, text or f"HTTP {status}"
    return 0, f"{type(e).__name__}: {e}"


class _Probe:
    """The self-test's keys and raw calls on one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.base = f"{SCRATCH}/{secrets.token_hex(8)}"
        self.name = f"{store.where(SCRATCH + '/')} ({store.endpoint or 'AWS S3'})"

    def rel(self, leaf: str) -> str:
        return f"{self.base}/{leaf}"

    def put(self, leaf: str, data: bytes, **cond: str) -> tuple[int, str, str]:
        """(status, etag, error text) of one raw PUT with its condition headers; 200 when it landed."""
        st = self.store
        try:
            r = st.client.put_object(Bucket=st.bucket, Key=st.key(self.rel(leaf)), Body=data, **cond)
        except Exception as e:  # a ClientError's status decides; anything else fails the step
            status, text = _error(e)
            if not status:
                raise _Failed(f"{self.name}: PUT {self.rel(leaf)} failed: {text}") from e
            return status, "", text
        return 200, str(r.get("ETag") or ""), ""

    def data(self, leaf: str) -> bytes | None:
        got = self.store.get(self.rel(leaf))
        return None if got is None else got.data

    def listed(self) -> set[str]:
        return {o.key for o in self.store.list(self.base + "/")}


def _step(name: str, p: _Probe, fn: Callable[[_Probe], str]) -> Check:
    try:
        return Check(name, True, fn(p))
    except (_Failed, StoreError) as e:
        return Check(name, False, str(e))
    except Exception as e:  # a refusal the retry loop passed on: one line, not a traceback
        return Check(name, False, f"{p.name}: {_error(e)[1]}")


def store_checks(url: str, endpoint: str | None, *, wait: float = 20.0, attempts: int = 2,
                 timeout: float = 10.0) -> list[Check]:
    """The store's self-test (the module's doc), on the sweep's URL `url` (`<storage>/ablate/<sweep>`)
    and `endpoint` (None: AWS S3). An unreachable store fails within about `wait` seconds, and then
    alone: nothing else can be tested."""
    where = endpoint or "AWS S3"
    try:
        store = Store(url, endpoint, wait=wait, attempts=attempts, timeout=timeout)
    except ImportError:
        return [Check("store", False, "boto3 is not installed here (the store's client): pip install boto3")]
    except Exception as e:  # botocore refuses an endpoint or region: one line, not a traceback
        return [Check("store", False, f"{url} at {where}: the client cannot be made: {_error(e)[1]}")]
    p = _Probe(store)
    first = _reach(p, where)
    if not first.ok:
        return [first]
    checks = [first]
    try:
        checks += [_step("store_create", p, _exclusive_create), _step("store_replace", p, _stale_replace),
                   _step("store_list", p, _list_after_write)]
    finally:
        checks.append(_step("store_cleanup", p, _cleanup))
    return checks


def _reach(p: _Probe, where: str) -> Check:
    t0 = time.monotonic()
    try:
        p.store.put(p.rel("reach"), b"ablate doctor: reachable\n")
    except StoreDown as e:
        return Check("store", False, f"{e} Check the profile's storage_endpoint and this machine's network")
    except Exception as e:  # a StoreError, or a refusal the retry loop passed on (404): one line
        why = str(e) if isinstance(e, StoreError) else _error(e)[1]
        if "NoSuchBucket" in why:
            return Check("store", False, f"{p.store.where()} ({where}): no such bucket {p.store.bucket!r}: "
                                         f"create it, or fix storage: in the profile")
        fix = (f"give credentials through {CHAIN}" if _credentials(why)
               else "check the bucket name in storage: and that these credentials may write to it")
        return Check("store", False, f"{why} ({where}); {fix}")
    return Check("store", True, f"{p.store.where()} ({where}) reachable, credentials accepted, "
                                f"writable ({time.monotonic() - t0:.2f} s)")


def _credentials(why: str) -> bool:
    words = ("credential", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden",
             "403", "ExpiredToken", "InvalidToken")
    return any(w.lower() in why.lower() for w in words)


def _exclusive_create(p: _Probe) -> str:
    status, _, text = p.put("create", b"first create\n", IfNoneMatch="*")
    if status != 200:
        raise _Failed(f"{p.name}: a conditional create (If-None-Match: *) of a new key failed ({text}); "
                      f"claims need it: use a store with conditional writes: {GOOD_STORES}")
    status, _, text = p.put("create", b"second create, other bytes\n", IfNoneMatch="*")
    if status == 200:
        raise _Failed(f"{p.name} IGNORES If-None-Match: a second conditional create of one key was "
                      f"accepted, so claims would not be exclusive there; use a store with conditional "
                      f"writes: {GOOD_STORES}")
    if status != 412:
        raise _Failed(f"{p.name}: a second conditional create of one key answered {status} ({text}), not "
                      f"412; claims need 412 there: use a store with conditional writes: {GOOD_STORES}")
    if p.data("create") != b"first create\n":
        raise _Failed(f"{p.name} answered 412 to a second conditional create but replaced the object; "
                      f"claims would not be exclusive there: use {GOOD_STORES}")
    return "If-None-Match: * is exclusive: a second create of one key fails with 412, the first kept"


def _stale_replace(p: _Probe) -> str:
    status, old, text = p.put("replace", b"version 1\n")
    status2, new, text2 = p.put("replace", b"version 2\n")
    if status != 200 or status2 != 200 or not old or not new:
        raise _Failed(f"{p.name}: plain PUTs of a scratch key failed ({text or text2 or 'no ETag'})")
    if old == new:
        raise _Failed(f"{p.name}: two versions of one key have the same ETag {old}; a takeover could "
                      f"not tell them apart: use {GOOD_STORES}")
    status, _, text = p.put("replace", b"version 3, from a stale read\n", IfMatch=old)
    if status == 200:
        raise _Failed(f"{p.name} IGNORES If-Match: a write with a stale ETag replaced the object, so a "
                      f"takeover could overwrite a live claim; use a store with conditional writes: "
                      f"{GOOD_STORES}")
    if status != 412:
        raise _Failed(f"{p.name}: a write with a stale ETag answered {status} ({text}), not 412; use a "
                      f"store with conditional writes: {GOOD_STORES}")
    status, _, text = p.put("replace", b"version 3\n", IfMatch=new)
    if status != 200:
        raise _Failed(f"{p.name}: a write with the current ETag was refused ({text}); takeovers need "
                      f"If-Match: use a store with conditional writes: {GOOD_STORES}")
    return "If-Match: a stale ETag fails with 412, the current one replaces"


def _list_after_write(p: _Probe) -> str:
    want = {p.rel(k) for k in ("reach", "create", "replace")}
    missing = sorted(want - p.listed())
    if missing:
        raise _Failed(f"{p.name}: {', '.join(missing)} written, then missing from a listing: the store's "
                      f"listings lag its writes, and ablate reads the sweep by listing: use {GOOD_STORES}")
    return f"a listing right after the writes shows all {len(want)} of them"


def _cleanup(p: _Probe) -> str:
    for o in p.store.list(p.base + "/"):
        p.store.delete(o.key)
    left = sorted(p.listed())
    if left:
        raise _Failed(f"{p.name}: deleted, still listed: {', '.join(left)}; remove {p.store.where(p.base)}/ "
                      f"by hand")
    return f"the scratch keys under {p.store.where(p.base)}/ deleted"


def store_host_check(project: Project, host: Host, ht: HostTransport,
                     creds: Mapping[str, str] | None) -> Check:
    """doctor's `store` check of a storage host: the instance runs the boot program with no file
    and no queue, and asks the store one question (a HEAD) with what launch would hand its queues:
    its Python, boto3, the network path to the endpoint, the credentials."""
    store = project.sweep_store(host)
    assert store is not None
    plan = BootPlan(host.name, store[0], store[1], project.sweep_root(host), (), host.profile.env or "",
                    host.profile.python)
    try:
        boot(ht, plan, {}, creds or {}, probe=True)
    except AblateError as e:
        return Check("store", False, e.message)
    return Check("store", True, f"the store {store[0]} answers the instance ({creds_note(creds or {})})")
