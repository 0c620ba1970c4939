"""`SharedFS.apply`: a batch of small ops run in order in one round trip, stopping at the first
failure with the FSError the single operation raises; the same on the local FS (in-process) and
over SSH (one run of the shipped probe on a real sshd of the test bed). And `apply_groups`: one
group's failure never stops the others."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ablate.errors import FSError, OpFailed
from ablate.remote.host import probe
from ablate.transport.base import (
    AppendLine,
    CreateImmutable,
    Read,
    Remove,
    SharedFS,
    WriteAtomic,
    apply_groups,
)
from ablate.transport.local import LocalFS
from ablate.transport.ssh import SSHHost
from ablate.transport.sshfs import SSHFS

FS = tuple[SharedFS, str, Path, str]  # the FS, its root as the FS sees it, the same dir here, via


@pytest.fixture(params=["local", pytest.param("ssh", marks=[pytest.mark.bed,  # on the SSH test bed
                                                             pytest.mark.xdist_group("ssh")])])
def fs_under_test(request: pytest.FixtureRequest, tmp_path: Path) -> FS:
    """local: a directory here; ssh: through a real sshd of the test bed, onto the directory every
    instance shares (a fresh sweep root each time: the probe is shipped by the first batch)."""
    if request.param == "local":
        backing = tmp_path / "fs"
        backing.mkdir()
        return LocalFS(str(backing)), str(backing), backing, "local"
    testbed = request.getfixturevalue("testbed")
    name = f"apply-{uuid.uuid4().hex[:8]}"
    backing = testbed.shared_dir / "ablate" / name
    backing.mkdir(parents=True)
    root = f"{testbed.shared_path}/ablate/{name}"
    return SSHFS(SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)), root), root, backing, "tb-h1"


def leftovers(backing: Path) -> list[str]:
    """Temp files a write left behind (the probe's library aside)."""
    return sorted(str(p.relative_to(backing)) for p in backing.rglob(".*")
                  if "lib" not in p.relative_to(backing).parts)


def test_ops_run_in_order_each_as_its_single_operation(fs_under_test: FS) -> None:
    fs, root, backing, _ = fs_under_test
    big = os.urandom(300 << 10)  # beyond what one argv word may carry: the ops travel on stdin
    got = fs.apply([
        WriteAtomic(f"{root}/q/a.txt", b"one"),
        Read(f"{root}/q/a.txt"),
        WriteAtomic(f"{root}/q/a.txt", b"two\x00\xff", 0o640),
        Read(f"{root}/q/a.txt"),
        AppendLine(f"{root}/q/a.ledger", '{"n": 1}'),
        AppendLine(f"{root}/q/a.ledger", '{"n": 2}\n'),
        CreateImmutable(f"{root}/w/run.sh", b"#!/bin/bash\necho v1\n"),
        CreateImmutable(f"{root}/w/run.sh", b"#!/bin/bash\necho v1\n"),
        WriteAtomic(f"{root}/big.bin", big),
        Read(f"{root}/big.bin"),
        Remove(f"{root}/stop"),
        WriteAtomic(f"{root}/stop", b""),
        Remove(f"{root}/stop"),
        Read(f"{root}/stop"),
        Read(f"{root}/nowhere/x"),
    ])
    assert got == [None, b"one", None, b"two\x00\xff", None, None, True, False, None, big,
                   False, None, True, None, None]
    assert (backing / "q" / "a.txt").read_bytes() == b"two\x00\xff"
    assert stat.S_IMODE((backing / "q" / "a.txt").stat().st_mode) == 0o640
    assert (backing / "q" / "a.ledger").read_text() == '{"n": 1}\n{"n": 2}\n'
    assert stat.S_IMODE((backing / "w" / "run.sh").stat().st_mode) == 0o444
    assert not (backing / "stop").exists()
    assert leftovers(backing) == []
    assert fs.apply([]) == []


def test_a_write_replaces_the_file_and_an_immutable_one_is_never_written_over(fs_under_test: FS) -> None:
    fs, root, backing, via = fs_under_test
    (backing / "queue.txt").write_bytes(b"old")
    os.link(backing / "queue.txt", backing / "reader")  # a reader holding the old file
    fs.apply([WriteAtomic(f"{root}/queue.txt", b"new")])
    # rename(2) over the name: the old inode is untouched (a reader sees old or new, never a mix)
    assert (backing / "reader").read_bytes() == b"old"
    assert (backing / "queue.txt").read_bytes() == b"new"

    (backing / "w.sh").write_bytes(b"v1")
    with pytest.raises(OpFailed) as e:
        fs.apply([CreateImmutable(f"{root}/w.sh", b"v2")])
    assert e.value.message == f"{via}: creating {root}/w.sh failed: it exists with other content; " \
                              "an immutable file is never overwritten"
    with pytest.raises(FSError) as single:
        fs.create_immutable(f"{root}/w.sh", b"v2")
    assert single.value.message == e.value.message  # what the single operation says, word for word
    assert (backing / "w.sh").read_bytes() == b"v1"
    assert leftovers(backing) == []


def test_the_first_failure_stops_the_batch_with_the_single_operations_error(fs_under_test: FS) -> None:
    fs, root, backing, via = fs_under_test
    (backing / "blocker").write_text("a file where a directory should be\n")
    (backing / "adir").mkdir()
    bad = f"{root}/blocker/sub/x"  # ENOTDIR on the way to it
    cases: list[tuple[Any, str, Callable[[], object]]] = [
        (WriteAtomic(bad, b"x"), "writing", lambda: fs.write_atomic(bad, b"x")),
        (CreateImmutable(bad, b"x"), "creating", lambda: fs.create_immutable(bad, b"x")),
        (AppendLine(bad, "x"), "appending to", lambda: fs.append_line(bad, "x")),
        (Remove(f"{root}/adir"), "removing", lambda: fs.remove(f"{root}/adir")),
        (Read(f"{root}/adir"), "reading", lambda: fs.read_bytes(f"{root}/adir")),
    ]
    for n, (op, verb, single) in enumerate(cases):
        before, after = f"{root}/before{n}", f"{root}/after{n}"
        with pytest.raises(OpFailed) as e:
            fs.apply([WriteAtomic(before, b"b"), Remove(f"{root}/none"), op, WriteAtomic(after, b"a")])
        got = e.value
        assert (got.index, got.done, got.via, got.op, got.path, got.exit_code) == (2, [None, False], via,
                                                                                    verb, op.path, 1)
        with pytest.raises(FSError) as alone:
            single()
        prefix = f"{via}: {verb} {op.path} failed"
        assert got.message.startswith(prefix) and alone.value.message.startswith(prefix), got.message
        why = "Is a directory" if verb in ("removing", "reading") else "Not a directory"
        assert why in got.message and "\n" not in got.message, got.message
        assert (backing / f"before{n}").read_bytes() == b"b"  # the ops before it took effect
        assert not (backing / f"after{n}").exists()  # none after it ran
    assert (backing / "adir").is_dir()
    assert leftovers(backing) == []


def test_one_failing_group_never_stops_the_others(fs_under_test: FS) -> None:
    fs, root, backing, _ = fs_under_test
    (backing / "blocker").write_text("x\n")
    (backing / "stop.b").write_text("")
    groups = [
        [WriteAtomic(f"{root}/a.txt", b"a"), Remove(f"{root}/stop.a")],
        [WriteAtomic(f"{root}/b.txt", b"b"), Remove(f"{root}/stop.b")],
        [WriteAtomic(f"{root}/blocker/c.txt", b"c"), Remove(f"{root}/stop.c")],
        [],
        [WriteAtomic(f"{root}/d.txt", b"d"), AppendLine(f"{root}/blocker/d.ledger", "d")],
        [WriteAtomic(f"{root}/e.txt", b"e"), Remove(f"{root}/stop.e")],
    ]
    got = apply_groups(fs, groups)
    assert got[:2] == [[None, False], [None, True]] and got[3] == [] and got[5] == [None, False]
    assert isinstance(got[2], OpFailed) and got[2].path == f"{root}/blocker/c.txt"
    assert isinstance(got[4], OpFailed) and got[4].path == f"{root}/blocker/d.ledger"
    assert sorted(p.name for p in backing.glob("*.txt")) == ["a.txt", "b.txt", "d.txt", "e.txt"]


def test_ops_that_must_go_first_fail_the_whole_batch_and_else_ride_along(fs_under_test: FS) -> None:
    """`apply_groups(first=...)`: the launch's DEPLOYED.json goes first in its records' round trip;
    when it cannot be written no group runs, else the groups go on as without it."""
    fs, root, backing, _ = fs_under_test
    (backing / "blocker").write_text("x\n")
    groups = [[WriteAtomic(f"{root}/a.txt", b"a")], [WriteAtomic(f"{root}/blocker/b.txt", b"b")],
              [AppendLine(f"{root}/c.ledger", "c")]]
    with pytest.raises(OpFailed) as e:
        apply_groups(fs, groups, first=[WriteAtomic(f"{root}/blocker/DEPLOYED.json", b"{}")])
    assert e.value.index == 0 and e.value.path == f"{root}/blocker/DEPLOYED.json"
    assert not (backing / "a.txt").exists() and not (backing / "c.ledger").exists()  # no group ran

    got = apply_groups(fs, groups, first=[WriteAtomic(f"{root}/DEPLOYED.json", b"{}")])
    assert got[0] == [None] and isinstance(got[1], OpFailed) and got[2] == [None]
    assert (backing / "DEPLOYED.json").read_bytes() == b"{}" and (backing / "c.ledger").read_text() == "c\n"
    assert apply_groups(fs, [], first=[Remove(f"{root}/DEPLOYED.json")]) == []  # no group: `first` alone
    assert not (backing / "DEPLOYED.json").exists()


def test_over_ssh_a_batch_is_one_command_and_shipping_the_probe_one_more(testbed: Any) -> None:
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    name = f"apply-{uuid.uuid4().hex[:8]}"
    root = f"{testbed.shared_path}/ablate/{name}"
    commands: list[str] = []
    exec_ = host.exec

    def counting(command: str, **kw: Any) -> Any:
        commands.append(command)
        return exec_(command, **kw)

    host.exec = counting  # type: ignore[method-assign]
    fs = SSHFS(host, root)
    ops = [CreateImmutable(f"{root}/specs/{i:02d}.env", f"spec {i}\n".encode()) for i in range(20)]
    assert fs.apply([*ops, Read(f"{root}/DEPLOYED.json")]) == [True] * 20 + [None]
    assert len(commands) == 3  # the probe (not shipped yet), shipping it, the probe again
    lib = testbed.shared_dir / "ablate" / name / "lib" / fs.lib_dir.rsplit("/", 1)[1] / "ablate" / "remote"
    assert stat.S_IMODE((lib / "host" / "probe.py").stat().st_mode) == 0o444
    assert (lib / "host" / "fs_writes.py").is_file()
    commands.clear()
    assert fs.apply([*ops, WriteAtomic(f"{root}/DEPLOYED.json", b"{}")]) == [False] * 20 + [None]
    assert len(commands) == 1


def test_the_host_side_answers_with_the_results_and_the_first_failure(tmp_path: Path) -> None:
    """What `probe apply` prints, run in-process (the ssh transport's half is tested above)."""
    (tmp_path / "w").write_bytes(b"v1")
    ops = [{"op": "append_line", "path": str(tmp_path / "l"), "line": "x"},
           {"op": "read", "path": str(tmp_path / "l")},
           {"op": "create_immutable", "path": str(tmp_path / "w"), "data": base64.b64encode(b"v2").decode(),
            "sha256": hashlib.sha256(b"v2").hexdigest()},
           {"op": "remove", "path": str(tmp_path / "l")}]
    got = json.loads(json.dumps(probe.run("apply", {"root": str(tmp_path), "ops": ops})))
    assert got == {"results": [None, "eAo="], "failed": {
        "index": 2, "reason": "it exists with other content; an immutable file is never overwritten"}}
    assert (tmp_path / "l").read_bytes() == b"x\n" and (tmp_path / "w").read_bytes() == b"v1"


def test_shipping_the_probe_never_writes_over_a_file_and_names_it(testbed: Any) -> None:
    name = f"apply-{uuid.uuid4().hex[:8]}"
    root = f"{testbed.shared_path}/ablate/{name}"
    fs = SSHFS(SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)), root)
    lib = testbed.shared_dir / "ablate" / name / "lib" / fs.lib_dir.rsplit("/", 1)[1] / "ablate" / "remote"
    lib.mkdir(parents=True)
    (lib / "layout.py").write_text("# not ablate's\n")
    with pytest.raises(FSError) as e:
        fs.apply([WriteAtomic(f"{root}/x", b"x")])
    assert e.value.message == (f"tb-h1: creating {fs.lib_dir}/ablate/remote/layout.py failed: it exists "
                               "with other content; an immutable file is never overwritten")
    assert (lib / "layout.py").read_text() == "# not ablate's\n"
    assert (lib / "host" / "fs_writes.py").is_file()
    assert not (lib / "host" / "probe.py").exists()  # probe.py comes last
    assert not (testbed.shared_dir / "ablate" / name / "x").exists()
