"""Shared fixtures: a private tmux server per test, no writes to the real home, the in-process CLI,
small real local projects, and the SSH test bed. What tests share besides fixtures lives in
tests/helpers/."""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import slurmbed
from tests.helpers import schedule, tiers
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.runners import Runners
from tests.helpers.s3 import CREDS, S3, moto_s3, read_botocore_data_once
from tests.helpers.testbed_projects import LIVE_BEDS, session_bed
from tests.testbed import Testbed


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in (("unit", "needs no root, no tmux, no bed, nothing from apt-get"),
                       ("tmux", "runs real tmux or another apt-installed tool; no root, no bed"),
                       ("bed", "runs on a namespace test bed (root)")):
        config.addinivalue_line("markers", f"{tier}: the {tier} tier: {what} (tests/helpers/tiers.py)")
    config.addinivalue_line("markers", "alone: times a window that another worker's load stretches; "
                                       "scripts/test.sh runs these after the rest, in one process")
    config.pluginmanager.register(schedule.Durations(config), "ablate-durations")
    schedule.one_last_collection(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.classify(items)
    tiers.groups_first(items)
    tiers.note_alone_files(items)
    schedule.longest_first(config, items)


@pytest.fixture(autouse=True)
def _isolate(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
             request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test gets its own tmux socket (killed afterwards) and a throw-away HOME (an exit-3 crash
    log lands under it: XDG_STATE_HOME is unset). A unit-tier test finds every apt-installed tool
    stubbed out on its PATH, and `python3` there is the interpreter running the tests
    (tests/helpers/tiers.py)."""
    socket = f"ablate-test-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("ABLATE_TMUX_SOCKET", socket)
    # A fresh name, not `mktemp("home")`: that one lists the whole base temp directory to number it,
    # and each test adds to it (a worker's thousandth test lists two thousand entries).
    home = Path(tempfile.mkdtemp(prefix="home-", dir=tmp_path_factory.getbasetemp()))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    # A `python -m ablate` a test starts runs in its own process, not through a command server
    # (ablate/cmdserver) that would outlive the test; tests/test_command_server.py turns it on.
    monkeypatch.setenv("ABLATE_CMDSERVER", "0")
    if request.node.get_closest_marker("unit"):  # the tools apt-get installs are not there for it
        stubs = tiers.stub_dir(tmp_path_factory.getbasetemp())
        monkeypatch.setenv("PATH", os.pathsep.join([str(stubs), *tiers.python_first(),
                                                    os.environ.get("PATH", "")]))
    yield socket
    if not request.node.get_closest_marker("unit"):
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


@pytest.fixture(scope="session", autouse=True)
def _botocore_data() -> None:
    """botocore's data files parsed once per process, not once per `Store` (tests/helpers/s3.py)."""
    read_botocore_data_once()


@pytest.fixture(scope="session")
def _moto() -> Iterator[S3]:
    with moto_s3() as s3:
        yield s3


@pytest.fixture
def s3(_moto: S3, monkeypatch: pytest.MonkeyPatch) -> S3:
    """A real S3 endpoint (moto's server, shared by the session) and a fresh bucket prefix's worth of
    credentials in the environment; each test uses its own prefix (`s3.url(prefix)`)."""
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    return _moto


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """`cli(project, *args)`: `ablate -C <project> ARGS` in this process -> (code, out, err);
    `cli.json(project, *args, code=0)`: the one JSON object of `ARGS --json`."""
    return Cli(capsys)


@pytest.fixture
def local_project(tmp_path: Path) -> LocalProject:
    root = tmp_path / "proj"
    root.mkdir()
    p = LocalProject(root)
    p.write_config()
    return p


@pytest.fixture
def runners(local_project: LocalProject) -> Iterator[Runners]:
    """run_queue processes a test starts by hand; any still alive at teardown gets its group killed."""
    r = Runners(local_project)
    yield r
    r.close()


@pytest.fixture
def tmux_socket() -> str:
    return os.environ["ABLATE_TMUX_SOCKET"]


# --------------------------------------------------------------------------- SSH test bed

@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """Three real sshd+tmux instances sharing one FS (tests/testbed.py); skips when not root or
    a tool is missing. Faults a test injects are undone after it by `_testbed_heal`."""
    yield from session_bed("bind")


@pytest.fixture(scope="session")
def testbed_sshfs() -> Iterator[Testbed]:
    """Like `testbed`, but the shared FS is a storage server each instance mounts over sshfs with its
    default options (client caches on: another instance's changes show up seconds later); skips
    when not root or sshfs, FUSE or a tool is missing. Healed after each test by `_testbed_heal`."""
    yield from session_bed("sshfs")


@pytest.fixture(scope="session")
def testbed_nofs() -> Iterator[Testbed]:
    """Three real sshd+tmux instances sharing nothing: each has only its own disk."""
    yield from session_bed("none")


@pytest.fixture(scope="session")
def testbed_slowfs() -> Iterator[Testbed]:
    """Like `testbed_sshfs`, with the caches a default NFS mount keeps (`acdirmax=60`): sshfs's
    `dcache_timeout=60`, so another instance's new file or append shows up to 60 s late."""
    yield from session_bed("sshfs", "dcache_timeout=60")


@pytest.fixture(autouse=True)
def _testbed_heal() -> Iterator[None]:
    yield
    for tb in LIVE_BEDS:
        tb.heal()


# --------------------------------------------------------------------------- Slurm test bed

@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[slurmbed.SlurmBed]:
    """A real Slurm cluster: slurmctld and three slurmd nodes `sn1..sn3`, each in its own network,
    UTS and mount namespace, sharing one directory (tests/slurmbed.py); skips when not root or
    Slurm or munge is missing. A test that kills a node or leaves jobs behind calls `heal()`."""
    reason = slurmbed.missing_requirement()
    if reason:
        pytest.skip(reason)
    with slurmbed.SlurmBed(3) as bed:
        yield bed
