"""A storage host's launch:
its boot program (ablate/remote/store/instance_boot.py, run as the instance runs it:
through a host transport, here the local one) against a real S3 endpoint (moto's server) and a real
tmux server. The files fetched and checked against their names, a missing or damaged one refusing
the launch with nothing started, a missing boto3 named; the credentials reach the queue's process
environment through the FIFO and nowhere else: not the spec, a file under the instance's copy, the
session's command, any process's argv, the tmux server, the store, or an error message."""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.doctor.deployed import deployed_check
from ablate.errors import AblateError, RemoteError
from ablate.remote.store.client import Store
from ablate.run import store_launch
from ablate.run.context import LaunchContext, LocalQueues
from ablate.run.host_measure import Section
from ablate.run.placement import place
from ablate.run.store_launch import BootPlan, Started, boot, boot_files, controller_credentials
from ablate.transport.local import LocalFS, LocalHost, tmux_socket
from tests.helpers.project import LocalProject
from tests.helpers.s3 import CREDS, S3
from tests.helpers.wait import wait_for

# run_queue's side of the FIFO contract (ablate/run/store_launch.py), then the queue's "work": a sleep
# that inherits the exported credentials (its /proc/<pid>/environ is the queue's process environment).
READER = """#!/bin/bash
if [[ -n ${ABLATE_CREDS_FIFO-} && -p $ABLATE_CREDS_FIFO ]]; then
  while IFS= read -r line; do
    [[ $line =~ ^(AWS_[A-Z_]+)=(.*)$ ]] && export "${BASH_REMATCH[1]}=${BASH_REMATCH[2]}"
  done <"$ABLATE_CREDS_FIFO"
  rm -f -- "$ABLATE_CREDS_FIFO"
fi
unset ABLATE_CREDS_FIFO
exec sleep 300
"""
DEAF = "#!/bin/bash\nexec sleep 300\n"  # never opens its FIFO
QUITS = "#!/bin/bash\nexit 0\n"  # ends before it reads its FIFO


def sha12(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


@pytest.fixture
def secret() -> dict[str, str]:
    """The controller's credentials in these tests: sentinel values grepped for everywhere."""
    tag = uuid.uuid4().hex
    return {"AWS_ACCESS_KEY_ID": f"AKIA{tag[:16].upper()}", "AWS_SECRET_ACCESS_KEY": f"sentinel-secret-{tag}",
            "AWS_SESSION_TOKEN": f"sentinel-token-{tag}", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def keys() -> Iterator[None]:
    """The test's own keys for moto (the store's side of the test), only while it sets the store up:
    a client keeps what it read when it was built."""
    saved = {k: os.environ.get(k) for k in CREDS}
    os.environ.update(CREDS)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Deployed:
    """What a deploy put into the store for one host (files named by their content), and the boot
    plan of an instance whose own copy is `root`."""

    def __init__(self, s3: S3, tmp: Path, run_queue: str = READER) -> None:
        self.s3, self.prefix = s3, f"t-{uuid.uuid4().hex[:8]}/ablate/t1"
        with keys():
            self.store = Store(s3.url(self.prefix), s3.endpoint)
        self.root = tmp / "instance" / "ckpt" / ".ablate" / "t1"
        self.data = {f"wrappers/run_queue.{sha12(run_queue.encode())}.sh": run_queue.encode()}
        for rel, body in (("wrappers/run_one.{}.sh", b"#!/bin/bash\n"), ("wrappers/runner.{}.pyz", b"PK zip"),
                          ("specs/{}.env", b"# ablate run spec\nABLATE_HOST=h1\n")):
            self.data[rel.format(sha12(body))] = body
        for rel, body in self.data.items():
            self.store.put(rel, body)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(self.data)

    def plan(self, python: str = sys.executable) -> BootPlan:
        return BootPlan("h1", self.s3.url(self.prefix), self.s3.endpoint, str(self.root), self.files, "",
                        python)

    def argv(self) -> list[str]:
        rq, spec = self.files[0], self.files[-1]
        return ["bash", str(self.root / rq), str(self.root / spec), "q1", "0"]


@pytest.fixture
def instance_env(s3: S3, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The instance has no credentials of its own (no AWS_* in its environment, no ~/.aws, no
    metadata service): whatever reaches the store got there from the controller."""
    for k in (*CREDS, "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", tmux_socket(), *args], capture_output=True, text=True).stdout


def pane_pid(session: str) -> int:
    return int(tmux("list-panes", "-t", f"={session}", "-F", "#{pane_pid}").split()[0])


def all_cmdlines() -> bytes:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                continue
    return b"\n".join(out)


def tree_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def store_bytes(s3: S3) -> bytes:
    """Every object of the bucket, keys and bodies (moto's server, through the fixture's keys)."""
    with keys():
        every = Store(s3.url(), s3.endpoint)
    out = []
    for o in every.list():
        got = every.get(o.key)
        out.append(o.key.encode() + (got.data if got is not None else b""))
    return b"".join(out)


def secrets_in(blob: bytes | str, creds: dict[str, str]) -> list[str]:
    data = blob.encode() if isinstance(blob, str) else blob
    return [k for k, v in creds.items() if k != "AWS_DEFAULT_REGION" and v.encode() in data]


# --------------------------------------------------------------------------- the hand-over


@pytest.mark.tmux
def test_the_queue_gets_the_credentials_in_its_environment_and_nowhere_else(
        s3: S3, tmp_path: Path, secret: dict[str, str], instance_env: None) -> None:
    dep = Deployed(s3, tmp_path)
    bucket_before = store_bytes(s3)
    got = boot(LocalHost("h1"), dep.plan(), {"ablate-t1-h1-q1": dep.argv()}, secret)
    assert got == {"ablate-t1-h1-q1": Started("started")}
    pid = pane_pid("ablate-t1-h1-q1")
    environ = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in e)
    assert {k: environ.get(k) for k in secret} == secret  # in the queue's process environment
    assert "ABLATE_CREDS_FIFO" not in environ
    # the files: fetched, intact, read-only; the FIFO gone
    for rel, body in dep.data.items():
        assert (dep.root / rel).read_bytes() == body
        assert stat.S_IMODE((dep.root / rel).stat().st_mode) == 0o444
    assert not list(dep.root.glob(".creds.*"))
    assert not list(dep.root.rglob("*.boot.*"))  # no temp file left
    # nowhere else
    start = tmux("list-panes", "-a", "-F", "#{pane_start_command}")
    assert "ABLATE_CREDS_FIFO=" in start and not secrets_in(start, secret)
    assert not secrets_in(tmux("show-environment", "-g"), secret)  # the tmux server's own
    assert not secrets_in(tmux("show-environment", "-t", "=ablate-t1-h1-q1"), secret)
    assert not secrets_in(all_cmdlines(), secret)  # any process's argv, the queue's too
    assert not secrets_in(Path(f"/proc/{pid}/cmdline").read_bytes(), secret)
    assert not secrets_in(tree_bytes(dep.root), secret)  # the spec and every file of the copy
    assert not secrets_in(tree_bytes(tmp_path), secret)
    after = store_bytes(s3)
    assert after == bucket_before and not secrets_in(after, secret)  # the store: read, never written


@pytest.mark.tmux
def test_files_already_there_and_intact_are_kept_a_damaged_copy_is_fetched_again(
        s3: S3, tmp_path: Path, secret: dict[str, str], instance_env: None) -> None:
    dep = Deployed(s3, tmp_path)
    run_one, spec = dep.files[1], dep.files[-1]
    (dep.root / "wrappers").mkdir(parents=True)
    (dep.root / run_one).write_bytes(dep.data[run_one])  # intact: kept (its mtime untouched)
    os.utime(dep.root / run_one, (1, 1))
    (dep.root / "specs").mkdir()
    (dep.root / spec).write_bytes(b"ABLATE_HOST=evil\n")  # damaged here: replaced by the store's
    (dep.root / spec).chmod(0o444)
    got = boot(LocalHost("h1"), dep.plan(), {"ablate-t1-h1-q1": dep.argv()}, secret)
    assert got["ablate-t1-h1-q1"].state == "started"
    assert (dep.root / run_one).stat().st_mtime == 1
    assert (dep.root / spec).read_bytes() == dep.data[spec]
    assert stat.S_IMODE((dep.root / spec).stat().st_mode) == 0o444


@pytest.mark.parametrize("fault", ["missing", "damaged"])
def test_a_file_missing_or_damaged_in_the_store_refuses_the_launch_and_starts_nothing(
        s3: S3, tmp_path: Path, secret: dict[str, str], instance_env: None, fault: str) -> None:
    dep = Deployed(s3, tmp_path)
    runner = dep.files[2]
    if fault == "missing":
        dep.store.delete(runner)
    else:
        dep.store.put(runner, b"not what its name says")
    with pytest.raises(RemoteError) as ei:
        boot(LocalHost("h1"), dep.plan(), {"ablate-t1-h1-q1": dep.argv()}, secret)
    msg = ei.value.message
    assert "\n" not in msg and msg.startswith("h1: ") and runner in msg and "nothing was started" in msg
    assert ("not in the store" if fault == "missing" else "damaged") in msg and "ablate deploy" in msg
    assert not secrets_in(msg, secret)
    assert "ablate-t1-h1-q1" not in tmux("list-sessions", "-F", "#{session_name}")
    assert not (dep.root / runner).exists() and not list(dep.root.glob(".creds.*"))


def test_no_boto3_on_the_instance_is_one_line_naming_the_install(
        s3: S3, tmp_path: Path, secret: dict[str, str], instance_env: None) -> None:
    dep = Deployed(s3, tmp_path)
    bare = tmp_path / "python-without-site"  # the profile's python, with no boto3 to import
    bare.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -S \"$@\"\n")
    bare.chmod(0o755)
    with pytest.raises(RemoteError) as ei:
        boot(LocalHost("h1"), dep.plan(python=str(bare)), {"ablate-t1-h1-q1": dep.argv()}, secret)
    msg = ei.value.message
    assert "\n" not in msg and "boto3" in msg and "pip install boto3" in msg and "profile's env" in msg
    assert not secrets_in(msg, secret)
    assert "ablate-t1-h1-q1" not in tmux("list-sessions", "-F", "#{session_name}")
    missing = dep.plan(python=str(tmp_path / "no-python"))
    with pytest.raises(RemoteError, match=r"no .*no-python there"):
        boot(LocalHost("h1"), missing, {"ablate-t1-h1-q1": dep.argv()}, secret)


@pytest.mark.tmux
def test_without_credentials_here_none_are_passed(s3: S3, tmp_path: Path, instance_env: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    dep = Deployed(s3, tmp_path)
    for k, v in CREDS.items():  # the instance's own chain reaches the store (as its role would)
        monkeypatch.setenv(k, v)
    got = boot(LocalHost("h1"), dep.plan(), {"ablate-t1-h1-q1": dep.argv()}, {})
    assert got == {"ablate-t1-h1-q1": Started("started")}
    assert "ABLATE_CREDS_FIFO" not in tmux("list-panes", "-a", "-F", "#{pane_start_command}")
    assert not list(dep.root.glob(".creds.*"))


@pytest.mark.tmux
@pytest.mark.parametrize("queue", [DEAF, QUITS], ids=["never-reads", "ends-first"])
def test_a_queue_that_does_not_take_its_credentials_is_stopped_and_its_fifo_removed(
        s3: S3, tmp_path: Path, secret: dict[str, str], instance_env: None, queue: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_launch, "FIFO_WAIT", 3.0)
    dep = Deployed(s3, tmp_path, run_queue=queue)
    got = boot(LocalHost("h1"), dep.plan(), {"ablate-t1-h1-q1": dep.argv()}, secret)
    s = got["ablate-t1-h1-q1"]
    assert s.state == "failed" and "did not take its credentials" in s.why
    assert ("within 3 s" if queue == DEAF else "ended before") in s.why
    assert not secrets_in(s.why, secret)
    assert "ablate-t1-h1-q1" not in tmux("list-sessions", "-F", "#{session_name}")
    assert not list(dep.root.glob(".creds.*"))


@pytest.mark.tmux
def test_a_session_already_there_is_running_and_left_alone(
        s3: S3, tmp_path: Path, secret: dict[str, str], instance_env: None) -> None:
    dep = Deployed(s3, tmp_path)
    tmux("new-session", "-d", "-s", "ablate-t1-h1-q1", "sleep 300")
    before = pane_pid("ablate-t1-h1-q1")
    got = boot(LocalHost("h1"), dep.plan(), {"ablate-t1-h1-q1": dep.argv(),
                                             "ablate-t1-h1-q2": [*dep.argv()[:3], "q2", "0"]}, secret)
    assert got == {"ablate-t1-h1-q1": Started("running"), "ablate-t1-h1-q2": Started("started")}
    assert pane_pid("ablate-t1-h1-q1") == before
    assert not list(dep.root.glob(".creds.*"))


# --------------------------------------------------------------------------- the controller's side


def test_the_controllers_credentials_come_from_the_aws_chain(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, secret: dict[str, str]) -> None:
    for k in (*CREDS, "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    assert controller_credentials() == {}  # none here: none passed
    (tmp_path / "credentials").write_text(f"[default]\naws_access_key_id = {secret['AWS_ACCESS_KEY_ID']}\n"
                                          f"aws_secret_access_key = {secret['AWS_SECRET_ACCESS_KEY']}\n")
    (tmp_path / "config").write_text("[default]\nregion = eu-west-3\n")
    assert controller_credentials() == {"AWS_ACCESS_KEY_ID": secret["AWS_ACCESS_KEY_ID"],
                                        "AWS_SECRET_ACCESS_KEY": secret["AWS_SECRET_ACCESS_KEY"],
                                        "AWS_DEFAULT_REGION": "eu-west-3"}
    for k, v in secret.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert controller_credentials() == {**secret, "AWS_REGION": "us-west-2"}


@pytest.mark.tmux
def test_a_storage_hosts_launch_boots_from_the_store_its_deploy_filled(
        s3: S3, local_project: LocalProject, tmp_path: Path, secret: dict[str, str],
        instance_env: None) -> None:
    """The launch pipeline's start on a storage host: what deploy placed (its wrappers, runner and
    the host's spec naming the instance's own copy) fetched there, then the real run_queue started
    with its credentials' FIFO. The host is reached through the local transport."""
    from ablate.run import pipeline

    prefix = f"p-{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path / "inst"
    (local_project.root / "profiles").mkdir()
    (local_project.root / "profiles" / "s3.yaml").write_text(
        f"transport: ssh\nstorage: {s3.url(prefix)}\nstorage_endpoint: {s3.endpoint}\n"
        f"ckpt_root: {ckpt}/{{host}}\npython: {sys.executable}\n")
    local_project.write_config(profile="s3", workdir=str(local_project.root))
    local_project.queue("q1", ["# ablate: host=h1", local_project.cfg("configs/a.yaml") + " recon"])
    project = load_project(local_project.root)
    staged = tmp_path / "staged"  # placement's writes, then copied into the store as a deploy would
    dep = place(project, LocalFS(str(staged)))
    url, endpoint = project.sweep_store() or ("", None)
    with keys():
        store = Store(url, endpoint)
    for p in staged.rglob("*"):
        if p.is_file():
            store.put(str(p.relative_to(staged)), p.read_bytes())
    local = LocalQueues.read(project)
    ctx = LaunchContext(project, local, LocalFS(str(staged)), None)
    ctx._transports["h1"] = LocalHost("h1")  # the instance, reached here
    ctx._creds.append(secret)
    qf = local.get(project, "q1")
    lines: list[str] = []
    ready = {0: pipeline._Ready(qf, "h1", None, 0, False)}
    got = pipeline._start_on_host(ctx, dep, "h1", ready, lines.append)
    assert got == {0: None}, got
    root = Path(project.sweep_root(project.hosts["h1"]))
    assert root == ckpt / "h1" / ".ablate" / "t1"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.stat().st_mode
                  & 0o777 == 0o444) == sorted(boot_files(dep, "h1"))
    assert "credentials from this controller" in lines[0] and "tmux ablate-t1-h1-q1" in lines[0]
    start = tmux("list-panes", "-a", "-F", "#{pane_start_command}")
    assert f"{root}/wrappers/{dep.run_queue}" in start and "ABLATE_CREDS_FIFO" in start
    wait_for(lambda: not list(root.glob(".creds.*")), timeout=10)  # run_queue took them
    assert not secrets_in(start, secret) and not secrets_in(all_cmdlines(), secret)
    assert not secrets_in(tree_bytes(ckpt), secret)


def test_doctor_checks_a_storage_hosts_deployed_files_in_the_store_and_notes_its_own_copy(
        s3: S3, local_project: LocalProject, tmp_path: Path) -> None:
    prefix = f"d-{uuid.uuid4().hex[:8]}"
    (local_project.root / "profiles").mkdir()
    (local_project.root / "profiles" / "s3.yaml").write_text(
        f"transport: ssh\nstorage: {s3.url(prefix)}\nstorage_endpoint: {s3.endpoint}\n"
        f"ckpt_root: {tmp_path}/inst/{{host}}\n")
    local_project.write_config(profile="s3", workdir="/srv/proj")
    project = load_project(local_project.root)
    h1 = project.hosts["h1"]
    staged = tmp_path / "staged"
    dep = place(project, LocalFS(str(staged)))
    url, endpoint = project.sweep_store() or ("", None)
    store = Store(url, endpoint)
    for p in staged.rglob("*"):
        if p.is_file():
            store.put(str(p.relative_to(staged)), p.read_bytes())
    deployed = {"version": dep.version, "run_queue": dep.run_queue, "run_one": dep.run_one,
                "runner": dep.runner, "specs": dict(dep.specs)}
    root = Path(project.sweep_root(h1))

    def doctor() -> tuple[str, bool, str]:  # the section doctor runs on the host: sha256sum there
        files = [str(root / f) for f in boot_files(dep, "h1")]
        p = subprocess.run(["sha256sum", "--", *files], capture_output=True, text=True)
        return deployed_check(project, h1, deployed, None, Section(p.returncode, p.stdout + p.stderr))

    name, ok, why = doctor()
    assert (name, ok) == ("deployed", True) and "in the store, sha256 matches (4 files)" in why
    assert "0 of 4 already in h1's own copy, the others fetched at its next launch" in why
    spec = f"specs/{dep.specs['h1']}"
    (root / "specs").mkdir(parents=True)
    (root / spec).write_bytes(b"damaged")
    ok, why = doctor()[1:]
    assert ok and f"({spec} damaged there: fetched again then)" in why
    store.put(f"wrappers/{dep.runner}", b"not its address")
    ok, why = doctor()[1:]
    assert not ok and "damaged" in why and dep.runner in why
    store.delete(f"wrappers/{dep.runner}")
    ok, why = doctor()[1:]
    assert not ok and "missing in the store" in why and "ablate deploy" in why


def test_only_aws_variables_of_one_line_are_handed_over(s3: S3, tmp_path: Path, secret: dict[str, str],
                                                        instance_env: None) -> None:
    dep = Deployed(s3, tmp_path)
    for bad in ({"HOME": "/root"}, {"AWS_SESSION_TOKEN": f"{secret['AWS_SESSION_TOKEN']}\nAWS_X=1"},
                {"AWS_SESSION_TOKEN": "t" * 4097}):
        with pytest.raises(AblateError) as ei:
            boot(LocalHost("h1"), dep.plan(), {"ablate-t1-h1-q1": dep.argv()}, {**secret, **bad})
        assert next(iter(bad)) in ei.value.message and not secrets_in(ei.value.message, secret)
    assert not dep.root.exists()  # refused before anything ran on the host


def test_launch_puts_the_cells_configs_in_the_store_once(local_project: LocalProject, s3: S3) -> None:
    """What an instance's clone may lack, as this repo has it: sent when the store lacks it or holds
    other bytes, not again; a config not readable here names the fix."""
    lp = local_project
    a, b = lp.cfg("cfgs/a/one.yaml"), lp.cfg("cfgs/a/two.yaml")
    project = load_project(lp.root)
    store = Store(s3.url(f"cfgs-{uuid.uuid4().hex[:8]}"), s3.endpoint)
    assert store_launch.upload_configs(project, store, [a, b, a]) == 2
    assert store_launch.upload_configs(project, store, [a, b]) == 0
    got = store.get(f"cfgs/{a}")
    assert got is not None and got.data == (lp.root / a).read_bytes()
    lp.cfg("cfgs/a/two.yaml", lr=0.5)
    assert store_launch.upload_configs(project, store, [a, b]) == 1
    with pytest.raises(AblateError, match=r"cannot read the config cfgs/a/nope\.yaml"):
        store_launch.upload_configs(project, store, ["cfgs/a/nope.yaml"])
