"""The test bed's network-FS mode is real (`testbed_sshfs`: every instance mounts the storage
server's directory over sshfs with Debian's default options): another instance's listing and stat
lag behind, atomic server-side operations stay atomic, and a storage outage ends in errors, not in
hangs. What these tests measure on this kind of machine (sshfs 3.7, `dcache_timeout` 20 s):

- a directory listing (and a stat) is served from the reader's cache for up to 20 s after that
  reader filled it: a file created, renamed in or removed elsewhere shows up there that late;
- an exact path that was not cached is looked up on the server (no negative cache), and every
  open() re-stats the file: a fresh open+read sees another host's append or atomic replace within
  about a second (the kernel's own 1 s attribute cache); a reader that keeps the file open (a log
  follower) and stat see the append only after up to 20 s;
- a directory removed elsewhere still looks present (mkdir: EEXIST) for up to 20 s;
- a storage outage blocks every call that needs the server until the ssh keep-alive gives up (about
  15-20 s with `ServerAliveInterval=5,ServerAliveCountMax=3`), which then fails with EIO; files
  opened before that stay broken (EIO), new calls reconnect once the storage is back. A shorter
  outage only blocks the calls until the connection resumes.
"""

from __future__ import annotations

import fcntl
import functools
import json
import select
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.wait import wait_for
from tests.testbed import BASE, Testbed, missing_requirement, reap_leftovers

pytestmark = pytest.mark.bed  # tests/helpers/tiers.py

# sshfs's cache lives 20 s (dcache_timeout): "missing at first" is only asserted when the check came
# this soon after the reader filled its cache (on a badly loaded machine it may come later).
STALE_CHECK_S = 12.0

# A process on an instance that keeps its open files (and so the mount's caches) between requests:
# one JSON request per line, [op, path, data]; one JSON reply per line: the result or {"errno": name}.
AGENT = r"""
import errno, json, os, sys, time
held = {}
for line in sys.stdin:
    op, path, data = json.loads(line)
    t = time.monotonic()
    try:
        if op == "ls":
            out = sorted(os.listdir(path))
        elif op == "read":
            with open(path) as f:
                out = f.read()
        elif op == "hold":
            held[path] = open(path)
            out = held[path].read()
        elif op == "reread":
            held[path].seek(0)
            out = held[path].read()
        elif op == "size":
            out = os.stat(path).st_size
        elif op == "publish":
            with open(path + ".tmp", "w") as f:
                f.write(data)
            os.rename(path + ".tmp", path)
            out = True
        elif op == "append":
            with open(path, "a") as f:
                f.write(data)
            out = True
        elif op == "write":
            with open(path, "w") as f:
                f.write(data)
            out = True
        elif op == "mkdir":
            os.mkdir(path)
            out = True
        elif op == "rmdir":
            os.rmdir(path)
            out = True
        else:
            out = {"errno": "unknown op " + op}
    except OSError as e:
        out = {"errno": errno.errorcode.get(e.errno or 0, str(e))}
    print(json.dumps({"out": out, "took": time.monotonic() - t}), flush=True)
"""


class Agent:
    """`AGENT` running on `host` over the real ssh client; every reply is awaited with a timeout."""

    def __init__(self, tb: Testbed, host: str) -> None:
        self.host = host
        argv = tb.ssh_argv(host, shlex.join([sys.executable, "-u", "-c", AGENT]))
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.took = 0.0

    def send(self, op: str, path: str, data: str = "") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([op, path, data]) + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 30.0) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"{self.host}: no reply within {timeout}s"
        line = self.proc.stdout.readline()
        assert line, f"{self.host}: the agent ended (exit {self.proc.poll()})"
        answer = json.loads(line)
        self.took = answer["took"]
        return answer["out"]

    def ask(self, op: str, path: str, data: str = "", timeout: float = 30.0) -> Any:
        self.send(op, path, data)
        return self.reply(timeout)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def agents(testbed_sshfs: Testbed) -> Iterator[dict[str, Agent]]:
    started = {h: Agent(testbed_sshfs, h) for h in testbed_sshfs.hosts}
    try:
        yield started
    finally:
        for a in started.values():
            a.close()


@pytest.fixture
def area(testbed_sshfs: Testbed) -> tuple[Path, str]:
    """A fresh directory of the shared FS: (its path on the server, its path on the instances)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    (testbed_sshfs.shared_dir / name).mkdir()
    return testbed_sshfs.shared_dir / name, f"{testbed_sshfs.shared_path}/{name}"


def _run(tb: Testbed, host: str, command: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(tb.ssh_argv(host, command), capture_output=True, text=True, timeout=timeout)


def _stale(since: float) -> bool:
    """Whether a check started now still falls within the cache lifetime of a fill at `since`."""
    return time.monotonic() - since < STALE_CHECK_S


def test_every_instance_mounts_the_storage_over_sshfs(testbed_sshfs: Testbed) -> None:
    tb = testbed_sshfs
    assert tb.shared == "sshfs" and tb.storage is not None
    source = f"storage:{tb.shared_dir}"
    for host in tb.hosts:
        mounts = _run(tb, host, "cat /proc/mounts").stdout.splitlines()
        assert f"{source} {tb.shared_path} fuse.sshfs" in "\n".join(mounts), (host, mounts)
    # The mounts live in the instances only; the server's directory is the truth.
    assert "fuse.sshfs" not in Path("/proc/self/mounts").read_text()
    name = f"hello-{uuid.uuid4().hex[:6]}"
    assert _run(tb, "tb-h1", f"echo hi > {tb.shared_path}/{name}").returncode == 0
    assert (tb.shared_dir / name).read_text() == "hi\n"
    assert _run(tb, "tb-h2", f"cat {tb.shared_path}/{name}").stdout == "hi\n"


def test_a_file_renamed_in_elsewhere_is_missing_from_a_listing_at_first(
        agents: dict[str, Agent], area: tuple[Path, str]) -> None:
    _, d = area
    h1, h2 = agents["tb-h1"], agents["tb-h2"]
    assert h2.ask("ls", d) == []  # h2's cache now holds the empty listing
    filled = time.monotonic()
    assert h1.ask("publish", f"{d}/result.json", '{"ok": 1}') is True  # temp + rename, as atomic writers
    written = time.monotonic()
    assert h1.ask("ls", d) == ["result.json"]  # the writer sees its own rename at once
    stale = _stale(filled)
    first = h2.ask("ls", d)
    if stale:
        assert first == [], "h2's listing showed the new file at once: its directory cache is off"
    wait_for(lambda: h2.ask("ls", d) == ["result.json"], timeout=60, interval=0.2)
    print(f"rename into a listed dir: h2's listing caught up {time.monotonic() - written:.1f}s after")
    # The exact path is looked up on the server (nothing negative is cached): it reads at once.
    assert h2.ask("read", f"{d}/result.json") == '{"ok": 1}'


def test_an_append_reaches_a_held_file_and_stat_late_and_a_fresh_open_soon(
        agents: dict[str, Agent], area: tuple[Path, str]) -> None:
    server, d = area
    (server / "log").write_text("first\n")
    h1, h2, h3 = agents["tb-h1"], agents["tb-h2"], agents["tb-h3"]
    assert h2.ask("hold", f"{d}/log") == "first\n"  # a follower keeps the file open (tail -f)
    assert h3.ask("size", f"{d}/log") == 6
    filled = time.monotonic()
    assert h1.ask("append", f"{d}/log", "second\n") is True
    written = time.monotonic()
    assert h1.ask("read", f"{d}/log") == "first\nsecond\n"  # the writer reads its own append
    assert (server / "log").read_text() == "first\nsecond\n"
    stale = _stale(filled)
    held, size = h2.ask("reread", f"{d}/log"), h3.ask("size", f"{d}/log")
    if stale:
        assert held == "first\n", "the held file showed the append at once: the attribute cache is off"
        assert size == 6, "stat showed the new size at once: the attribute cache is off"
    wait_for(lambda: h2.ask("reread", f"{d}/log") == "first\nsecond\n", timeout=60, interval=0.2)
    wait_for(lambda: h3.ask("size", f"{d}/log") == 13, timeout=60, interval=0.2)
    print(f"append: a held reader and stat caught up {time.monotonic() - written:.1f}s after")

    # open() re-stats the file on the server: a fresh open+read is current once the kernel's own
    # attribute cache (1 s) of an earlier stat lapses, long before the 20 s of sshfs's cache.
    assert h3.ask("size", f"{d}/log") == 13
    assert h1.ask("append", f"{d}/log", "third\n") is True
    written = time.monotonic()
    wait_for(lambda: h3.ask("read", f"{d}/log") == "first\nsecond\nthird\n", timeout=5, interval=0.1)
    print(f"append: a fresh open+read caught up {time.monotonic() - written:.1f}s after")


def test_mkdir_of_one_new_directory_from_two_instances_exactly_one_wins(
        testbed_sshfs: Testbed, agents: dict[str, Agent], area: tuple[Path, str]) -> None:
    server, d = area
    h1, h2, h3 = agents["tb-h1"], agents["tb-h2"], agents["tb-h3"]
    assert h1.ask("ls", d) == [] and h2.ask("ls", d) == []
    filled = time.monotonic()
    assert h3.ask("mkdir", f"{d}/other") is True
    if _stale(filled):  # both caches are stale now: neither lists h3's directory
        assert h1.ask("ls", d) == [] and h2.ask("ls", d) == []
    for i in range(5):
        target = f"{d}/claim-{i}"
        for a in (h1, h2):  # both requests are on their way before either reply is read
            a.send("mkdir", target)
        results = sorted([h1.reply(), h2.reply()], key=str)
        assert results == [True, {"errno": "EEXIST"}], (i, results)
        assert (server / f"claim-{i}").is_dir()

    # A stale positive entry is another matter: a directory removed elsewhere still looks taken
    # (EEXIST without asking the server) until the cache expires. A lock built on mkdir/rmdir sees
    # its released lock as held for up to the cache lifetime.
    assert h1.ask("ls", f"{d}/claim-0") == []  # h1 caches claim-0 (it made it)
    assert h3.ask("rmdir", f"{d}/claim-0") is True
    removed = time.monotonic()
    assert not (server / "claim-0").exists()
    result = h1.ask("mkdir", f"{d}/claim-0")
    if time.monotonic() - removed < STALE_CHECK_S:
        assert result == {"errno": "EEXIST"}, result
        wait_for(lambda: h1.ask("mkdir", f"{d}/claim-0") is True, timeout=60, interval=0.5)
    print(f"mkdir after another host's rmdir: refused for {time.monotonic() - removed:.1f}s")
    assert (server / "claim-0").is_dir()


def test_a_storage_outage_fails_calls_instead_of_hanging_and_every_mount_recovers(
        testbed_sshfs: Testbed, agents: dict[str, Agent], area: tuple[Path, str]) -> None:
    tb = testbed_sshfs
    server, d = area
    outage = 20.0
    h1, h2 = agents["tb-h1"], agents["tb-h2"]
    assert h1.ask("write", f"{d}/before", "b") is True
    tb.storage_down()
    began = time.monotonic()
    try:
        h1.send("write", f"{d}/during", "w")  # in flight while the storage is away
        h2.send("read", f"{d}/before")
        # The outage's length is the fault itself, not a wait for a condition.
        time.sleep(max(0.0, began + outage - time.monotonic()))
    finally:
        tb.storage_up()
    during = h1.reply(timeout=60)
    write_took = h1.took
    read = h2.reply(timeout=60)
    print(f"write during a {outage:.0f}s outage: {during} after {write_took:.1f}s; "
          f"read: {read} after {h2.took:.1f}s")
    # Either outcome is allowed (the keep-alive gives up after 15-20 s), but it is an answer:
    assert during in (True, {"errno": "EIO"}), during
    assert read in ("b", {"errno": "EIO"}), read
    assert write_took < outage + 30
    if during is True:
        assert (server / "during").read_text() == "w"

    def works(host: str) -> bool:
        name = f"after-{host}"
        p = _run(tb, host, f"echo {host} > {d}/{name} && cat {d}/{name} {d}/before", timeout=20)
        return p.returncode == 0 and p.stdout == f"{host}\nb"

    for host in tb.hosts:
        wait_for(functools.partial(works, host), timeout=60, interval=0.5)
    print(f"every mount read and wrote again {time.monotonic() - began - outage:.1f}s after the outage")
    assert sorted(p.name for p in server.glob("after-*")) == [f"after-{h}" for h in tb.hosts]


def _netns_commands(tb: Testbed, host: str) -> list[str]:
    """The command names of the processes living in `host`'s network namespace."""
    pids = subprocess.run(["ip", "netns", "pids", tb.netns(host)], capture_output=True, text=True).stdout
    names = []
    for pid in pids.split():
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            continue
    return names


def test_instance_faults_take_the_mount_along(testbed_sshfs: Testbed, area: tuple[Path, str]) -> None:
    tb = testbed_sshfs
    server, d = area
    (server / "keep").write_text("k")
    assert "sshfs" in _netns_commands(tb, "tb-h3")  # the mount's process lives in the instance
    tb.kill("tb-h3")
    assert _netns_commands(tb, "tb-h3") == []
    tb.revive("tb-h3")  # a fresh mount
    assert _run(tb, "tb-h3", f"cat {d}/keep").stdout == "k"
    tb.reboot("tb-h3")
    assert _run(tb, "tb-h3", f"cat {d}/keep").stdout == "k"
    assert _netns_commands(tb, "tb-h3").count("sshfs") == 1
    tb.read_only("tb-h2", d)
    p = _run(tb, "tb-h2", f"touch {d}/x")
    assert p.returncode != 0 and "Read-only file system" in p.stderr
    assert _run(tb, "tb-h1", f"touch {d}/x").returncode == 0  # only tb-h2's view is read-only
    tb.heal()
    assert _run(tb, "tb-h2", f"touch {d}/y").returncode == 0
    tb.link_down("tb-h1")
    tb.heal()  # the link back up, and tb-h1's mount answering again
    assert _run(tb, "tb-h1", f"cat {d}/keep").stdout == "k"


def test_teardown_during_an_outage_leaves_no_mount_or_namespace() -> None:
    reason = missing_requirement("sshfs")
    if reason:
        pytest.skip(reason)
    tb = Testbed(1, shared="sshfs")
    tb.start()
    blocked: subprocess.Popen[bytes] | None = None
    try:
        tb.storage_down()
        # A process stuck on the stalled mount when the bed goes away.
        blocked = subprocess.Popen(tb.ssh_argv("tb-h1", f"exec touch {tb.shared_path}/x"),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: "touch" in _netns_commands(tb, "tb-h1"), timeout=20)
    finally:
        began = time.monotonic()
        tb.close()
    assert time.monotonic() - began < 30
    if blocked is not None:
        blocked.wait(timeout=30)
    _assert_gone(tb.rid, tb.dir)


def test_a_dead_runs_bed_and_storage_are_reaped_by_the_next_run() -> None:
    reason = missing_requirement("sshfs")
    if reason:
        pytest.skip(reason)
    code = ("import sys, time; from tests.testbed import Testbed; tb = Testbed(1, shared='sshfs'); "
            "tb.start(); tb.storage_down(); print(tb.rid, tb.dir, flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parent.parent,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        ready, _, _ = select.select([owner.stdout], [], [], 60)
        assert ready, "the bed of the helper process did not come up"
        rid, bed_dir = owner.stdout.readline().split()
        assert f"tb{rid}st" in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        owner.kill()  # dies without its `finally`: the bed, its mounts and its storage stay
        owner.wait(timeout=10)
    with open(BASE / ".lock", "w") as lock:  # as Testbed.start does
        fcntl.flock(lock, fcntl.LOCK_EX)
        reap_leftovers()
    _assert_gone(rid, Path(bed_dir))


def _assert_gone(rid: str, bed_dir: Path) -> None:
    """Nothing of the bed `rid` is left: no namespace, no mount in any namespace, no state dir."""
    assert rid not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not bed_dir.exists()
    leftover = []
    for mounts in Path("/proc").glob("[0-9]*/mounts"):
        try:
            leftover += [m for m in mounts.read_text().splitlines() if rid in m]
        except OSError:
            continue
    assert leftover == []
