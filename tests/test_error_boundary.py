"""The one error boundary: an unexpected exception is exit 3 with one line naming it and its
traceback in a log file; SystemExit and Ctrl-C pass through as they were. And one error type for a
failed shared-FS operation (`FSError`, exit 1), whichever transport reached the FS."""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ablate.doctor.command
import ablate.monitor.status
from ablate.errors import FSError
from ablate.transport.base import SharedFS
from ablate.transport.local import LocalFS
from ablate.transport.ssh import SSHHost
from ablate.transport.sshfs import SSHFS
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject

UNEXPECTED = re.compile(r"ablate: error: unexpected (\S+): (.*) \(traceback in (/\S+\.log)\)")


@pytest.fixture
def state_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the traceback logs go in these tests: under the throw-away HOME, never the real one."""
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    return Path(os.environ["HOME"]) / ".local" / "state" / "ablate"  # HOME: conftest's temp dir


def divide_by_zero(*args: object, **kwargs: object) -> Any:
    return 1 // 0


# --------------------------------------------------------------------------- exit 3


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_unexpected_error_is_exit_3_one_line_and_its_traceback_in_a_log(
        local_project: LocalProject, cli: Cli, monkeypatch: pytest.MonkeyPatch,
        state_dir: Path, as_json: bool) -> None:
    monkeypatch.setattr(ablate.monitor.status, "status", divide_by_zero)
    code, out, err = cli(local_project, "status", *(["--json"] if as_json else []))

    assert code == 3, (out, err)
    [line] = err.splitlines()
    m = UNEXPECTED.fullmatch(line)
    assert m, line
    assert m.group(1) == "ZeroDivisionError" and m.group(2) == "integer division or modulo by zero"
    log = Path(m.group(3))
    assert log.parent == state_dir and re.fullmatch(rf"ablate-error-\d{{8}}T\d{{6}}Z-{os.getpid()}-\S+\.log",
                                                     log.name), log
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    text = log.read_text()
    assert "Traceback (most recent call last):" in text
    assert "in divide_by_zero" in text and "return 1 // 0" in text  # the frame that raised
    assert "ZeroDivisionError: integer division or modulo by zero" in text
    assert f"argv: ablate -C {local_project.root} status" in text
    if as_json:
        assert json.loads(out) == {"error": line.removeprefix("ablate: error: ")}  # exactly one object
    else:
        assert out == ""


def test_each_unexpected_error_gets_its_own_log(local_project: LocalProject, cli: Cli,
                                                monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    monkeypatch.setattr(ablate.monitor.status, "status", divide_by_zero)
    logs = set()
    for _ in range(3):  # same pid, same second
        code, _, err = cli(local_project, "status")
        m = UNEXPECTED.fullmatch(err.strip())
        assert code == 3 and m, err
        logs.add(m.group(3))
    assert len(logs) == 3 and sorted(str(p) for p in state_dir.iterdir()) == sorted(logs)


def test_the_log_goes_to_xdg_state_home_else_the_temp_dir(
        local_project: LocalProject, cli: Cli, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setattr(ablate.monitor.status, "status", divide_by_zero)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code, _, err = cli(local_project, "status")
    m = UNEXPECTED.fullmatch(err.strip())
    assert code == 3 and m and Path(m.group(3)).parent == tmp_path / "state" / "ablate", err

    # The state dir cannot be created (a file is in the way, as root too): the temp dir instead.
    (tmp_path / "blocked").write_text("a file, not a directory\n")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "blocked" / "state"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    code, _, err = cli(local_project, "status")
    m = UNEXPECTED.fullmatch(err.strip())
    assert code == 3 and m and Path(m.group(3)).parent == tmp_path / "tmp", err
    assert "ZeroDivisionError" in Path(m.group(3)).read_text()


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_no_writable_log_location_still_reports_the_error_and_the_traceback(
        local_project: LocalProject, cli: Cli, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, as_json: bool) -> None:
    monkeypatch.setattr(ablate.monitor.status, "status", divide_by_zero)
    (tmp_path / "blocked").write_text("a file, not a directory\n")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "blocked" / "state"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "blocked" / "tmp"))
    code, out, err = cli(local_project, "status", *(["--json"] if as_json else []))
    assert code == 3
    first, *rest = err.splitlines()
    assert first == ("ablate: error: unexpected ZeroDivisionError: integer division or modulo by zero "
                     "(no log file could be written; traceback below)")
    assert rest[0] == "Traceback (most recent call last):" and "return 1 // 0" in err
    assert rest[-1] == "ZeroDivisionError: integer division or modulo by zero"
    assert (json.loads(out) == {"error": first.removeprefix("ablate: error: ")}) if as_json else out == ""


def test_a_json_result_already_printed_gets_no_second_object(
        local_project: LocalProject, cli: Cli, monkeypatch: pytest.MonkeyPatch,
        state_dir: Path) -> None:
    class Report:
        """A doctor report whose verdict breaks after its JSON is out."""

        def to_json(self) -> dict[str, Any]:
            return {"hosts": {"h1": {"ok": True}}}

        def lines(self) -> list[str]:
            return ["h1 ok"]

        @property
        def ok(self) -> bool:
            raise RuntimeError("verdict lost")

    monkeypatch.setattr(ablate.doctor.command, "doctor", lambda *args, **kwargs: Report())
    code, out, err = cli(local_project, "doctor", "--json")
    assert code == 3
    assert json.loads(out) == {"hosts": {"h1": {"ok": True}}}  # the one object, nothing after it
    m = UNEXPECTED.fullmatch(err.strip())
    assert m and m.group(1) == "RuntimeError" and m.group(2) == "verdict lost", err


def test_system_exit_and_ctrl_c_pass_the_boundary_unchanged(
        local_project: LocalProject, cli: Cli, monkeypatch: pytest.MonkeyPatch,
        state_dir: Path) -> None:
    def leave(*args: object, **kwargs: object) -> None:
        raise SystemExit(130)  # what `status --watch` does on Ctrl-C, after restoring the terminal

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ablate.monitor.status, "watch", leave)
    assert cli(local_project, "status", "--watch") == (130, "", "")

    monkeypatch.setattr(ablate.monitor.status, "status", ctrl_c)
    code, out, err = cli(local_project, "status", "--json")
    assert (code, err.strip()) == (130, "ablate: error: aborted")  # click turns Ctrl-C into Abort
    assert json.loads(out) == {"error": "aborted"}

    # An expected error (exit 2, covered in test_cli) is no crash either: none of these wrote a log.
    assert cli(local_project, "launch", "h1", "--host", "zz")[0] == 2
    assert not state_dir.exists()


# --------------------------------------------------------------------------- FSError


def block_shared_fs(p: LocalProject) -> Path:
    """A regular file where the sweep root's parent directory should be: every operation under the
    sweep root fails with ENOTDIR, for root as for anyone (file modes would not stop root)."""
    blocker = p.shared.parent
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the shared FS's ablate/ directory should be\n")
    return blocker


CLI_FS_FAILURES = [
    (["status", "--json"], "probe snapshot of {root}"),
    (["status"], "probe snapshot of {root}"),
    (["deploy", "--json"], "locking {root}/locks/controller.lock"),
]


@pytest.mark.parametrize(("args", "what"), CLI_FS_FAILURES, ids=[" ".join(a) for a, _ in CLI_FS_FAILURES])
def test_a_failed_shared_fs_operation_is_one_line_exit_1_never_a_traceback(
        local_project: LocalProject, cli: Cli, state_dir: Path,
        args: list[str], what: str) -> None:
    local_project.cfg("configs/recon/a.yaml")
    local_project.queue("h1", ["# ablate: host=h1", "configs/recon/a.yaml recon"])
    block_shared_fs(local_project)
    code, out, err = cli(local_project, *args)
    assert code == 1, (out, err)
    [line] = err.splitlines()
    message = f"local: {what.format(root=local_project.shared)} failed: [Errno 20] Not a directory"
    assert line.startswith(f"ablate: error: {message}"), line
    if "--json" in args:
        assert json.loads(out) == {"error": line.removeprefix("ablate: error: ")}
    else:
        assert out == ""
    assert not state_dir.exists()  # an FS failure is no crash: no traceback log


@pytest.fixture(params=["local", pytest.param("ssh", marks=[pytest.mark.bed,  # on the SSH test bed
                                                             pytest.mark.xdist_group("ssh")])])
def fs_under_test(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[SharedFS, str, Path, str]:
    """(the FS, its root as the FS sees it, the same directory on this machine, the `via` it names);
    ssh: through a real sshd of the test bed, onto the directory every instance shares."""
    if request.param == "local":
        backing = tmp_path / "fs"
        backing.mkdir()
        return LocalFS(str(backing)), str(backing), backing, "local"
    testbed = request.getfixturevalue("testbed")
    name = f"errors-{uuid.uuid4().hex[:8]}"
    backing = testbed.shared_dir / "ablate" / name
    backing.mkdir(parents=True)
    root = f"{testbed.shared_path}/ablate/{name}"
    return SSHFS(SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)), root), root, backing, "tb-h1"


def test_both_transports_raise_fs_error_for_the_same_failure(
        fs_under_test: tuple[SharedFS, str, Path, str], tmp_path: Path) -> None:
    fs, root, backing, via = fs_under_test
    (backing / "blocker").write_text("a file where a directory should be\n")
    (backing / "src").write_text("to rename\n")
    (backing / "adir").mkdir()
    bad = f"{root}/blocker/sub"  # its parent is a regular file: ENOTDIR on the way to it

    failing: dict[str, tuple[str, Callable[[], object]]] = {
        "writing": (f"{bad}/x", lambda: fs.write_atomic(f"{bad}/x", b"x")),
        "creating": (f"{bad}/x", lambda: fs.create_immutable(f"{bad}/x", b"x")),
        "appending to": (f"{bad}/x", lambda: fs.append_line(f"{bad}/x", "x")),
        "locking": (f"{bad}/x.lock", lambda: fs.lock(f"{bad}/x.lock", 1.0)),
        "renaming": (f"{root}/src to {bad}/x", lambda: fs.rename_noreplace(f"{root}/src", f"{bad}/x")),
        "probe snapshot of": (bad, lambda: fs.probe("snapshot", {"root": bad})),
    }
    for op, (target, call) in failing.items():
        with pytest.raises(FSError) as exc:
            call()
        e = exc.value
        assert (e.via, e.op, e.exit_code) == (via, op, 1), e.message
        assert e.message.startswith(f"{via}: {op} {target} failed"), e.message
        assert "Not a directory" in e.message and "\n" not in e.message, e.message

    # Nothing there is not a failure, the same way on both.
    assert fs.read_bytes(f"{bad}/x") is None and not fs.exists(f"{bad}/x")
    assert fs.listdir(bad) == [] and fs.listdir(f"{root}/blocker") == []
    assert fs.remove(f"{bad}/x") is False
    assert fs.rename_noreplace(f"{bad}/x", f"{root}/y") is False

    # A directory where a file is expected, and the refusals: FSError too.
    with pytest.raises(FSError, match=rf"^{via}: reading {root}/adir failed"):
        fs.read_bytes(f"{root}/adir")
    with pytest.raises(FSError, match=rf"^{via}: removing {root}/adir failed.*Is a directory"):
        fs.remove(f"{root}/adir")
    assert fs.create_immutable(f"{root}/w.sh", b"v1") is True
    with pytest.raises(FSError, match=rf"^{via}: creating {root}/w.sh failed.*other content"):
        fs.create_immutable(f"{root}/w.sh", b"v2")
    with pytest.raises(FSError, match=rf"^{via}: renaming {root}/src to {root}/w.sh failed.*exists"):
        fs.rename_noreplace(f"{root}/src", f"{root}/w.sh")
    assert (backing / "w.sh").read_bytes() == b"v1" and (backing / "src").exists()

    # fetch keeps raising OSError (pull relies on it), on both.
    with pytest.raises(OSError):
        fs.fetch(f"{bad}/x", str(tmp_path / "fetched"))
