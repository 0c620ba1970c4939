"""A profile's `storage:` (the sweep's state in an S3-compatible bucket) instead of `shared_fs:`:
what it parses to, where each side sees the sweep root, and every bad form refused with exit 2 and
one line naming the file, the key and the fix."""

# The case table below keeps one case per line, which reads better than wrapping it.
# ruff: noqa: E501

from __future__ import annotations

from pathlib import Path

import pytest

from ablate.config.project import load_profile, load_project, shipped_profiles
from ablate.errors import ConfigError
from tests.helpers.project import LocalProject

STORE = "storage: s3://sweep-bucket/team/sweeps\nckpt_root: /root/ckpt/{host}\n"


def _profile(p: LocalProject, name: str, body: str) -> None:
    (p.root / "profiles").mkdir(exist_ok=True)
    (p.root / "profiles" / f"{name}.yaml").write_text(body)


def _refused(p: LocalProject, *needles: str) -> str:
    with pytest.raises(ConfigError) as ei:
        load_project(p.root)
    msg = ei.value.message
    assert ei.value.exit_code == 2 and "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def test_a_storage_profile_puts_the_sweep_in_the_store_and_each_host_copy_on_its_own_disk(
        local_project: LocalProject) -> None:
    _profile(local_project, "s3", STORE + "storage_endpoint: http://127.0.0.1:9000/\n")
    local_project.write_config(profile="s3", workdir="/srv/proj")
    p = load_project(local_project.root)
    assert p.profile.storage == "s3://sweep-bucket/team/sweeps"
    assert p.profile.storage_endpoint == "http://127.0.0.1:9000"
    assert p.profile.shared_fs == "/root/ckpt/{host}/.ablate"  # the parent of each host's copy
    h1 = p.hosts["h1"]
    assert h1.sweep_parent == "/root/ckpt/h1/.ablate"
    assert p.sweep_root(h1) == f"{h1.ckpt_root}/.ablate/t1" == "/root/ckpt/h1/.ablate/t1"
    assert p.layout(p.hosts["h2"]).root == "/root/ckpt/h2/.ablate/t1"
    assert p.sweep_root() == "s3://sweep-bucket/team/sweeps/ablate/t1"
    assert p.sweep_store() == p.sweep_store(h1) == ("s3://sweep-bucket/team/sweeps/ablate/t1",
                                                   "http://127.0.0.1:9000")


@pytest.mark.parametrize(("given", "url"), [
    ("s3://sweep-bucket", "s3://sweep-bucket/ablate/t1"),
    ("s3://sweep-bucket/", "s3://sweep-bucket/ablate/t1"),
    ("s3://sweep-bucket/a/b/", "s3://sweep-bucket/a/b/ablate/t1"),
    ("s3://my.bucket-2/x", "s3://my.bucket-2/x/ablate/t1"),
])
def test_the_storage_url_is_normalised_and_aws_needs_no_endpoint(local_project: LocalProject, given: str,
                                                                 url: str) -> None:
    _profile(local_project, "s3", f"storage: {given}\nckpt_root: /root/ckpt\n")
    local_project.write_config(profile="s3", workdir="/srv/proj")
    assert load_project(local_project.root).sweep_store() == (url, None)


def test_a_shared_fs_profile_has_no_store_and_keeps_its_roots(local_project: LocalProject) -> None:
    _profile(local_project, "nfs", "shared_fs: /mnt/nfs\nckpt_root: /scratch/{host}\n")
    local_project.write_config(profile="nfs", workdir="/srv/proj")
    p = load_project(local_project.root)
    assert p.sweep_store() is None and p.sweep_store(p.hosts["h1"]) is None
    assert p.profile.storage is None and p.profile.storage_endpoint is None
    assert p.sweep_root() == p.sweep_root(p.hosts["h1"]) == "/mnt/nfs/ablate/t1"
    assert p.hosts["h1"].sweep_parent == "/mnt/nfs"


BAD: list[tuple[str, str, list[str]]] = [
    ("both", "shared_fs: /mnt/a\nstorage: s3://sweep-bucket/p\nckpt_root: /b\n", ["profiles/s3.yaml", "storage", "either shared_fs", "not both"]),
    ("neither", "ckpt_root: /b\n", ["profiles/s3.yaml", "shared_fs: is required", "storage: s3://BUCKET/PREFIX"]),
    ("not s3", "storage: gs://sweep-bucket/p\nckpt_root: /b\n", ["storage", "not an s3:// URL", "s3://BUCKET/PREFIX"]),
    ("https url", "storage: https://sweep-bucket.s3.amazonaws.com/p\nckpt_root: /b\n", ["storage", "not an s3:// URL"]),
    ("upper-case bucket", "storage: s3://Sweep_Bucket/p\nckpt_root: /b\n", ["storage", "not a bucket name", "conditional writes"]),
    ("short bucket", "storage: s3://ab/p\nckpt_root: /b\n", ["storage", "not a bucket name"]),
    ("dot-dot prefix", "storage: s3://sweep-bucket/a/../b\nckpt_root: /b\n", ["storage", "'..'"]),
    ("shell prefix", "storage: s3://sweep-bucket/a$(id)\nckpt_root: /b\n", ["storage", "a shell would interpret"]),
    ("storage a list", "storage: [s3://sweep-bucket]\nckpt_root: /b\n", ["storage", "non-empty string"]),
    ("endpoint alone", "shared_fs: /mnt/a\nstorage_endpoint: https://s3.example.com\nckpt_root: /b\n", ["storage_endpoint", "needs storage"]),
    ("endpoint no scheme", STORE + "storage_endpoint: s3.example.com\n", ["storage_endpoint", "http(s)://HOST[:PORT][/PATH]"]),
    ("endpoint ftp", STORE + "storage_endpoint: ftp://s3.example.com\n", ["storage_endpoint", "http(s)://HOST"]),
    ("endpoint user:pass", STORE + "storage_endpoint: https://AKIA123:secret@s3.example.com\n", ["storage_endpoint", "credentials never go in ablate.yaml; use the AWS chain"]),
    ("endpoint user only", STORE + "storage_endpoint: https://key@s3.example.com\n", ["credentials never go in ablate.yaml"]),
    ("endpoint creds, no scheme", STORE + "storage_endpoint: AKIA123:hunter2@s3.example.com\n", ["storage_endpoint", "credentials never go in ablate.yaml"]),
    ("endpoint query", STORE + "storage_endpoint: https://s3.example.com/?X-Amz-Credential=AKIA\n", ["storage_endpoint", "credentials never go in ablate.yaml"]),
    ("endpoint fragment", STORE + "storage_endpoint: https://s3.example.com/#x\n", ["storage_endpoint", "fragment"]),
    ("endpoint bad port", STORE + "storage_endpoint: https://s3.example.com:99999\n", ["storage_endpoint", "HOST[:PORT]"]),
    ("endpoint bad host", STORE + "storage_endpoint: https://s3_example$.com\n", ["storage_endpoint", "HOST[:PORT]"]),
    ("storage, transport local", "transport: local\n" + STORE, ["storage", "transport: ssh", "a directory on this machine", "give shared_fs"]),
    ("storage, transport slurm", "transport: slurm\n" + STORE, ["storage", "transport: ssh", "the cluster's shared FS"]),
    ("relative ckpt_root", "storage: s3://sweep-bucket/p\nckpt_root: ckpt\n", ["ckpt_root", "absolute"]),
]


@pytest.mark.parametrize(("case", "body", "needles"), BAD, ids=[c[0] for c in BAD])
def test_bad_storage_profiles_are_refused_naming_the_fix(local_project: LocalProject, case: str, body: str,
                                                          needles: list[str]) -> None:
    _profile(local_project, "s3", body)
    local_project.write_config(profile="s3", workdir="/srv/proj")
    _refused(local_project, *needles)


@pytest.mark.parametrize("endpoint", ["https://AKIA123:hunter2@s3.example.com/?sig=zz9",
                                      "AKIA123:hunter2@s3.example.com", "s3.example.com?AKIA123=hunter2"])
def test_no_credential_from_the_endpoint_is_echoed(local_project: LocalProject, endpoint: str) -> None:
    _profile(local_project, "s3", STORE + f"storage_endpoint: {endpoint}\n")
    local_project.write_config(profile="s3", workdir="/srv/proj")
    msg = _refused(local_project, "credentials never go in ablate.yaml")
    assert "hunter2" not in msg and "AKIA123" not in msg and "zz9" not in msg


def test_a_local_host_of_a_storage_profile_is_refused(local_project: LocalProject) -> None:
    _profile(local_project, "s3", STORE)
    local_project.write_config(profile="s3", workdir="/srv/proj",
                               hosts={"h1": {}, "h2": {"transport": "local"}})
    _refused(local_project, "hosts.h2.transport", "only ssh hosts")


@pytest.mark.parametrize(("top", "other", "needles"), [
    ("s3", "nfs", ["hosts.h2.profile", "on the shared FS /mnt/nfs", "in s3://sweep-bucket/team/sweeps", "one place"]),
    ("nfs", "s3", ["hosts.h2.profile", "profile s3 keeps the sweep in s3://sweep-bucket", "top-level profile nfs"]),
    ("s3", "s3b", ["hosts.h2.profile", "s3://other-bucket", "one place"]),
    ("s3", "s3e", ["hosts.h2.profile", "at https://r2.example.com", "one place"]),
])
def test_one_sweep_lives_in_one_place(local_project: LocalProject, top: str, other: str,
                                      needles: list[str]) -> None:
    _profile(local_project, "s3", STORE)
    _profile(local_project, "s3b", "storage: s3://other-bucket\nckpt_root: /root/ckpt\n")
    _profile(local_project, "s3e", STORE + "storage_endpoint: https://r2.example.com\n")
    _profile(local_project, "nfs", "shared_fs: /mnt/nfs\nckpt_root: /scratch\n")
    local_project.write_config(profile=top, workdir="/srv/proj", hosts={"h1": {}, "h2": {"profile": other}})
    _refused(local_project, *needles)


def test_two_profiles_of_one_store_may_share_a_sweep(local_project: LocalProject) -> None:
    _profile(local_project, "s3", STORE)
    _profile(local_project, "s3big", "storage: s3://sweep-bucket/team/sweeps/\nckpt_root: /data/ckpt\n")
    local_project.write_config(profile="s3", workdir="/srv/proj", hosts={"h1": {}, "h2": {"profile": "s3big"}})
    p = load_project(local_project.root)
    assert p.sweep_root(p.hosts["h2"]) == "/data/ckpt/.ablate/t1"
    assert p.sweep_store(p.hosts["h2"]) == p.sweep_store()


def test_the_shipped_vast_profile_keeps_the_sweep_in_a_bucket(tmp_path: Path) -> None:
    vast = load_profile("vast", tmp_path, "t")
    assert vast.transport == "ssh" and vast.storage is not None and vast.storage.startswith("s3://")
    assert vast.storage_endpoint is None and vast.shared_fs == f"{vast.ckpt_root}/.ablate"
    text = shipped_profiles()["vast"]
    for needle in ("R2", "B2", "MinIO", "storage_endpoint", "conditional writes", "AWS chain",
                   "boto3", "doctor"):
        assert needle in text, needle
