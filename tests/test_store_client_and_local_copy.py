"""The object store's operations and the local copy of a sweep kept in one, against a real S3 HTTP
endpoint (moto's server): conditional creates and replaces, appends by read-modify-write, the
store's clock, and a copy that follows the store (new, changed, grown and gone keys, results only
once committed)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from ablate.remote.store.client import Store, StoreDown, StoreError, parse_url
from ablate.remote.store.local_copy import WALK, Mirror
from tests.helpers.s3 import CREDS, S3, FaultProxy, quick_backoff


def store(s3: S3) -> Store:
    return Store(s3.url(f"t/{uuid.uuid4().hex[:8]}/ablate/sw"), s3.endpoint, wait=2)


def test_parse_url_names_the_problem() -> None:
    assert parse_url("s3://my-bucket/a/b/") == ("my-bucket", "a/b")
    assert parse_url("s3://my-bucket") == ("my-bucket", "")
    for bad, word in (("http://b/x", "s3://"), ("s3://B_ad/x", "bucket name"), ("s3://ok-b/a/../x", "'..'")):
        with pytest.raises(ValueError, match=word):
            parse_url(bad)


def test_conditional_create_and_replace(s3: S3) -> None:
    st = store(s3)
    first = st.create("claims/c1/owner", b"h1 q 0 1.0 - n\n")
    assert first is not None
    assert st.create("claims/c1/owner", b"h2 q 0 2.0 - n\n") is None  # somebody's: 412
    assert st.create("claims/c1/owner", b"h1 q 0 1.0 - n\n") == first  # a retried create of ours
    assert st.replace("claims/c1/owner", b"h3", "0" * 32) is None  # a stale etag
    new = st.replace("claims/c1/owner", b"h3", first)
    assert new is not None and new != first
    assert st.replace("claims/c1/owner", b"h4", first) is None  # the version read is gone
    got = st.get("claims/c1/owner")
    assert got is not None and got.data == b"h3"


def test_racing_creates_one_winner_and_appends_all_kept(s3: S3) -> None:
    st = store(s3)
    won: list[int] = []
    # Six racers, each with its own client (made before the race: a client costs a tenth of a second
    # of CPU), let go at once by a barrier: every create and every first append is concurrent.
    racers = 6
    lines: list[bytes] = [f'{{"i": {i}}}\n'.encode() for i in range(racers)]
    clients = [Store(st.url, s3.endpoint, wait=2) for _ in range(racers)]
    go = threading.Barrier(racers)

    def racer(i: int) -> None:
        mine = clients[i]
        go.wait()
        if mine.create("claims/race/owner", f"racer {i}\n".encode()) is not None:
            won.append(i)
        mine.append("events/h.q.jsonl", lines[i])

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    got = st.get("claims/race/owner")
    assert got is not None and got.data == f"racer {won[0]}\n".encode()
    ev = st.get("events/h.q.jsonl")
    assert ev is not None and sorted(ev.data.splitlines(keepends=True)) == sorted(lines)


def test_unreachable_store_waits_then_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    quick_backoff(monkeypatch)
    for k, v in CREDS.items():  # credentials, so what is tested is the unreachable endpoint
        monkeypatch.setenv(k, v)
    st = Store("s3://sweep-bucket/x", "http://127.0.0.1:9", wait=1, attempts=1)
    t0 = time.monotonic()
    with pytest.raises(StoreDown, match="did not answer"):
        st.get("anything")
    assert time.monotonic() - t0 < 30


def test_store_clock_is_the_stores(s3: S3) -> None:
    st = store(s3)
    assert abs(st.now() - time.time()) < 5


def commit(st: Store, name: str, manifest: dict[str, object], files: dict[str, bytes]) -> None:
    nonce = uuid.uuid4().hex[:12]
    for rel, data in files.items():
        st.put(f"results/{name}/{nonce}/{rel}", data)
    raw = json.dumps(manifest).encode()
    st.put(f"results/{name}/{nonce}/MANIFEST.json", raw)
    assert st.create(f"commits/{name}", json.dumps({"nonce": nonce}).encode()) is not None


def test_mirror_follows_the_store(s3: S3, tmp_path: Path) -> None:
    st = store(s3)
    root = str(tmp_path / "copy")
    st.put("claims/a/owner", b"h q 0 1 - n\n")
    st.put("claims/b/owner", b"h q 1 1 - n\n")
    st.put("events/h.q.jsonl", b'{"ev": "start"}\n')
    st.put("heartbeats/h.q", b'{"state": "running"}\n')
    st.put("heartbeats/me.q", b'{"theirs": 1}\n')
    st.put("results/c/zzz/MANIFEST.json", b"{}")  # uploaded, never committed: no result
    m = Mirror(st, root, own={"heartbeats/me.q"})
    os.makedirs(f"{root}/heartbeats")
    Path(f"{root}/heartbeats/me.q").write_text("mine\n")
    m.sync(WALK)
    assert sorted(os.listdir(f"{root}/claims")) == ["a", "b"]
    assert Path(f"{root}/heartbeats/me.q").read_text() == "mine\n"  # own: never overwritten
    assert not os.path.exists(f"{root}/final_ckpts/c")
    hb_age = time.time() - os.stat(f"{root}/heartbeats/h.q").st_mtime
    assert -3 < hb_age < 5  # the store's LastModified, in this clock

    st.delete("claims/b/owner")  # released
    st.append("events/h.q.jsonl", b'{"ev": "end"}\n')
    commit(st, "c", {"name": "c"}, {"best.pt": b"weights"})
    m.sync(WALK)
    assert sorted(os.listdir(f"{root}/claims")) == ["a"]  # the claim's directory is gone too
    assert Path(f"{root}/events/h.q.jsonl").read_bytes() == b'{"ev": "start"}\n{"ev": "end"}\n'
    assert st.requests.get("get", 0) > 0
    assert json.loads(Path(f"{root}/final_ckpts/c/MANIFEST.json").read_text()) == {"name": "c"}
    assert not os.path.exists(f"{root}/final_ckpts/c/best.pt")

    before = m.fetched
    m.sync(WALK)
    assert m.fetched == 0 and before > 0  # nothing changed: nothing read

    m.sync(WALK, results="all")
    assert Path(f"{root}/final_ckpts/c/best.pt").read_bytes() == b"weights"

    st.put("aside/c.123", b"{}")
    st.delete("commits/c")
    m.sync((*WALK, "aside/"))
    assert not os.path.exists(f"{root}/final_ckpts/c")
    assert os.path.isdir(f"{root}/final_ckpts/.aside.c.123")


def test_what_another_process_on_the_copy_claimed_is_never_synced_over(s3: S3, tmp_path: Path) -> None:
    """One queue per GPU: each queue's runner keeps the host's copy with a Mirror of its own. What
    one claimed (`claim_own`: its events, its heartbeat) the other's syncs leave alone, though that
    one never claimed it and the store holds an older version: a line appended here and not uploaded
    yet is never replaced by the store's copy. (The two-queue run in test_store_queue.py meets this
    race about one time in eight; here it is every time.)"""
    st = store(s3)
    root = str(tmp_path / "copy")
    key = "events/h.q2.jsonl"
    st.put(key, b'{"ev": "start"}\n')  # q2's last upload
    q1, q2 = Mirror(st, root), Mirror(st, root)
    q2.claim_own([key])
    os.makedirs(f"{root}/events")
    mine = '{"ev": "start"}\n{"ev": "end"}\n'  # q2 appended here, its upload still to come
    Path(f"{root}/{key}").write_text(mine)
    q1.sync(WALK)
    assert Path(f"{root}/{key}").read_text() == mine
    st.put(key, b'{"ev": "start"}\n{"ev": "other"}\n')  # the store changes again
    Mirror(st, root).sync(WALK)  # a later process, too
    assert Path(f"{root}/{key}").read_text() == mine


def test_a_throttling_store_is_retried_with_backoff(s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    """503 SlowDown on the next requests: each operation still does what it says, once."""
    quick_backoff(monkeypatch)
    proxy = FaultProxy(s3.endpoint)
    try:
        st = Store(s3.url(f"t/{uuid.uuid4().hex[:8]}"), proxy.endpoint, wait=60)
        # Two throttled answers before the first conditional write: two retries, each after
        # botocore's backoff (a random part of 1 s, then of 2 s; here of 1/20 of them), below its
        # attempts (5); one before the second and one before the append.
        proxy.slowdown = 2
        assert st.create("claims/x/owner", b"me\n") is not None
        assert proxy.seen == 3  # two throttled, then the create
        proxy.slowdown = 1
        assert st.create("claims/x/owner", b"you\n") is None  # still exclusive after a retry
        assert proxy.seen == 6  # one throttled, the refused create, the read that finds it another's
        proxy.slowdown = 1
        st.append("events/h.q.jsonl", b"a\n")
        got = st.get("events/h.q.jsonl")
        assert got is not None and got.data == b"a\n"
    finally:
        proxy.close()


def test_an_upload_throttled_past_botocores_attempts_is_waited_out(
        s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's `upload_file` wraps a throttle that outlasted botocore's attempts in its own
    `S3UploadFailedError`: the store waits it out as any other (a checkpoint's commit exited 1 on
    it in CI), and a refusal under the same wrapper is still a refusal, named."""
    quick_backoff(monkeypatch)
    proxy = FaultProxy(s3.endpoint)
    try:
        st = Store(s3.url(f"t/{uuid.uuid4().hex[:8]}"), proxy.endpoint, wait=60, attempts=2, pause=0.1)
        src = tmp_path / "model.safetensors"
        src.write_bytes(b"w" * 1000)
        proxy.slowdown = 3  # two attempts throttled, a wait, one more throttled, then the upload
        st.upload("ckpt/model.safetensors", str(src))
        got = st.get("ckpt/model.safetensors")
        assert got is not None and got.data == src.read_bytes()
        assert proxy.slowdown == 0 and st.requests["upload"] == 2
        gone = Store(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x", proxy.endpoint, wait=60, attempts=2)
        with pytest.raises(StoreError, match="NoSuchBucket"):
            gone.upload("ckpt/model.safetensors", str(src))
    finally:
        proxy.close()


def test_an_outage_is_waited_out(s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store unreachable for a while: the operation waits for it and then succeeds."""
    quick_backoff(monkeypatch)
    proxy = FaultProxy(s3.endpoint)
    try:
        st = Store(s3.url(f"t/{uuid.uuid4().hex[:8]}"), proxy.endpoint, wait=60, attempts=2, pause=0.1)
        st.put("a", b"1")
        proxy.down()
        # down for 0.5 s: past botocore's own attempts and the first two of the store's waits (0.1 s,
        # then 0.2 s, 0.4 s)
        timer = threading.Timer(0.5, proxy.up)
        timer.start()
        t0 = time.monotonic()
        assert st.create("claims/y/owner", b"me\n") is not None
        assert time.monotonic() - t0 >= 0.45
        timer.join()
    finally:
        proxy.close()


def test_a_claim_written_here_goes_when_the_store_releases_it(s3: S3, tmp_path: Path) -> None:
    """A queue's own claim is in its copy at once, and gone from it once remediate released it in
    the store (a stale local claim would have the walk pass the cell over forever)."""
    from ablate.remote.store.queue_side import Agent

    url = s3.url(f"t/{uuid.uuid4().hex[:8]}/ablate/sw")
    a = Agent(str(tmp_path / "copy"), "h1", "q1", url, s3.endpoint)
    assert a.claim("c1", 0, "", "node")
    owner = tmp_path / "copy" / "claims" / "c1" / "owner"
    assert owner.read_text().split()[:2] == ["h1", "q1"]
    Store(url, s3.endpoint).delete("claims/c1/owner")  # remediate's release
    a.pull()
    assert not owner.exists() and not owner.parent.exists()


def test_a_sync_never_removes_a_prefix_directory_itself(s3: S3, tmp_path: Path) -> None:
    """An empty `events/` (a queue about to write its first event) stays: only what the store no
    longer has goes, a released claim's own directory with it."""
    st = store(s3)
    root = tmp_path / "copy"
    for d in ("events", "heartbeats", "claims"):
        (root / d).mkdir(parents=True)
    Mirror(st, str(root)).sync(WALK)
    assert all((root / d).is_dir() for d in ("events", "heartbeats", "claims"))
