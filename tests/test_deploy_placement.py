"""What deploy places, built from the package: each wrapper one file with the shared bash inlined,
the runner zipapp byte-for-byte the modules the controller imports; a storage host's spec."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

from ablate import resources
from ablate.config.project import Project, load_project
from ablate.run.placement import RUNNER_MODULES, packaged_runner, packaged_wrappers, place
from ablate.transport.local import LocalFS
from tests.helpers.project import LocalProject

REPO = Path(__file__).resolve().parent.parent


def test_each_wrapper_is_deployed_with_the_shared_bash_inlined_once() -> None:
    common = (REPO / "wrappers" / "common.sh").read_text()
    for kind, data in packaged_wrappers().items():
        text = data.decode()
        source = (REPO / "wrappers" / f"{kind}.sh").read_text()
        assert 'common.sh"  # ablate: inline' in source  # written once, in common.sh
        assert "fs_wait() {" not in source
        assert text.count(common) == 1 and text.count("fs_wait() {") == 1, kind
        assert 'common.sh"  # ablate: inline' not in text  # nothing is sourced at run time
        assert subprocess.run(["bash", "-n"], input=data, check=False).returncode == 0, kind


def test_rendering_a_deployed_wrapper_again_changes_nothing(tmp_path: Path) -> None:
    from ablate.run import placement

    rendered = packaged_wrappers()["run_queue"]
    assert placement._INLINE.sub(b"X", rendered) == rendered


def test_the_runner_zipapp_holds_the_package_modules_and_is_deterministic() -> None:
    data = packaged_runner()
    assert data == packaged_runner()
    z = zipfile.ZipFile(io.BytesIO(data))
    files = resources.module_files(resources.zipapp_modules(RUNNER_MODULES))
    assert z.namelist() == ["__main__.py", *files]
    assert z.read("__main__.py").startswith(resources.CACHED_MAIN)
    for m in RUNNER_MODULES:
        assert z.read(m.replace(".", "/") + ".py") == resources.module(m)


def test_the_runner_zipapp_imports_its_store_modules_without_boto3(tmp_path: Path) -> None:
    """A storage host's runner opens the store through `store.client` and `store.local_copy`; importing them
    needs the standard library only (boto3 is imported when a store is opened)."""
    pyz = tmp_path / "runner.pyz"
    pyz.write_bytes(packaged_runner())
    code = ("import sys\n"
            "class NoBoto:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('boto3', 'botocore'):\n"
            "            raise ImportError('no ' + name)\n"
            "sys.meta_path.insert(0, NoBoto())\n"
            f"sys.path.insert(0, {str(pyz)!r})\n"
            "import ablate.remote.store.local_copy, ablate.remote.store.client\n"
            "m = ablate.remote.store.client\n"
            "assert m.__file__.startswith(sys.path[0]), m.__file__\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=False)
    assert p.returncode == 0 and p.stdout == "ok\n", p.stderr


def _spec(fs_root: Path, project: Project, host: str) -> dict[str, str]:
    dep = place(project, LocalFS(str(fs_root)))
    text = (fs_root / "specs" / dep.specs[host]).read_text()
    return {k: shlex.split(v)[0] if v else "" for k, _, v in
            (line.partition("=") for line in text.splitlines() if not line.startswith("#"))}


def test_a_storage_hosts_spec_names_the_store_and_its_own_copys_paths(local_project: LocalProject,
                                                                      tmp_path: Path) -> None:
    (local_project.root / "profiles").mkdir()
    (local_project.root / "profiles" / "s3.yaml").write_text(
        "transport: ssh\nstorage: s3://sweep-bucket/team\nstorage_endpoint: http://127.0.0.1:9000\n"
        "ckpt_root: /root/ckpt/{host}\n")
    local_project.write_config(profile="s3", workdir="/srv/proj")
    project = load_project(local_project.root)
    store = tmp_path / "store"  # what the controller writes into: the store, here a directory
    spec = _spec(store, project, "h2")
    wrappers = sorted(p.name for p in (store / "wrappers").iterdir())
    run_one = next(n for n in wrappers if n.startswith("run_one."))
    runner = next(n for n in wrappers if n.startswith("runner."))
    local = "/root/ckpt/h2/.ablate/t1"  # the instance's own copy, where its launch fetches them
    assert spec["ABLATE_ROOT"] == local
    assert spec["ABLATE_RUN_ONE"] == f"{local}/wrappers/{run_one}"
    assert spec["ABLATE_RUNNER_PY"] == f"{local}/wrappers/{runner}"
    assert spec["ABLATE_CKPT_ROOT"] == "/root/ckpt/h2"
    assert spec["ABLATE_STORE"] == "s3://sweep-bucket/team/ablate/t1"
    assert spec["ABLATE_STORE_ENDPOINT"] == "http://127.0.0.1:9000"
    (local_project.root / "profiles" / "s3.yaml").write_text(  # AWS S3 itself: no endpoint
        "transport: ssh\nstorage: s3://sweep-bucket\nckpt_root: /root/ckpt\n")
    aws = _spec(tmp_path / "aws", load_project(local_project.root), "h1")
    assert aws["ABLATE_STORE"] == "s3://sweep-bucket/ablate/t1" and aws["ABLATE_STORE_ENDPOINT"] == ""


def test_a_shared_fs_hosts_spec_has_no_store_keys(local_project: LocalProject, tmp_path: Path) -> None:
    project = load_project(local_project.root)
    spec = _spec(Path(project.sweep_root()), project, "h1")
    assert spec["ABLATE_ROOT"] == project.sweep_root(project.hosts["h1"])
    assert not any(k.startswith("ABLATE_STORE") for k in spec)


def test_every_number_the_wrappers_wait_by_is_in_every_spec_and_nowhere_in_the_bash(
        local_project: LocalProject, tmp_path: Path) -> None:
    """Each default is defined once, in Python: every spec carries the numbers run_queue and run_one
    check for (their one definition's values), and no wrapper holds a numeric fallback of its own."""
    import re

    from ablate.config.slurm import DEFAULT_GRACE, DEFAULT_MAX_RESTARTS
    from ablate.remote.queue.defaults import CLAIM_WAIT, HEARTBEAT_SECS
    from ablate.remote.store.client import FS_WAIT

    loop = re.search(r"^for v in (.*?); do$", (REPO / "wrappers" / "run_queue.sh").read_text(), re.M | re.S)
    assert loop is not None  # run_queue's check of its spec's numbers
    checked = set(re.findall(r"\bABLATE_[A-Z_]+\b", loop.group(1))) - {"ABLATE_SERVICES", "ABLATE_SVC_GRACE"}
    assert "ABLATE_FS_WAIT" in (REPO / "wrappers" / "run_one.sh").read_text()  # run_one checks it too
    for path in (REPO / "wrappers").glob("*.sh"):
        assert not re.findall(r"\$\{ABLATE_[A-Z_]+:-[0-9]", path.read_text()), path.name
    project = load_project(local_project.root)
    spec = _spec(Path(project.sweep_root()), project, "h1")
    assert {"ABLATE_STOP_GRACE", "ABLATE_CLAIM_WAIT", "ABLATE_FS_WAIT", "ABLATE_SLURM_GRACE",
            "ABLATE_SLURM_MAX_RESTARTS", "ABLATE_HEARTBEAT_SECS"} <= checked
    missing = {k for k in checked if not re.fullmatch(r"[0-9]{1,7}", spec.get(k, ""))}
    assert not missing, missing
    assert (spec["ABLATE_CLAIM_WAIT"], spec["ABLATE_FS_WAIT"], spec["ABLATE_HEARTBEAT_SECS"]) == (
        str(CLAIM_WAIT), str(int(FS_WAIT)), str(project.heartbeat_secs))
    local_project.write_config(heartbeat_secs=None)  # absent: the one default
    assert load_project(local_project.root).heartbeat_secs == HEARTBEAT_SECS
    assert (spec["ABLATE_SLURM_GRACE"], spec["ABLATE_SLURM_MAX_RESTARTS"], spec["ABLATE_STOP_GRACE"]) == (
        str(DEFAULT_GRACE), str(DEFAULT_MAX_RESTARTS), "120")
