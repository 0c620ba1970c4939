"""A Slurm project's configuration through the CLI: every bad `slurm:` mapping, Slurm host or
profile is refused by `ablate plan` with exit 2, one line naming the file, the key and the fix, and
nothing written; a good one plans N queues for a host of `queues: N`, and each queue's sbatch
options come out in the documented order. No Slurm is needed: plan runs no sbatch (the profile has
no `login`, so its shared FS is a directory here)."""

# The case tables below keep one case per line, which reads better than wrapping them.
# ruff: noqa: E501

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.config.project import load_profile, load_project, shipped_profiles
from ablate.config.slurm import SLURM_KEYS, SlurmSettings
from tests.helpers.cli import Cli
from tests.helpers.project import yaml_text

CELLS = [f"c{i}" for i in range(6)]


class SlurmProject:
    """A user's project whose host `cluster` is `queues: N` batch jobs of profile `cluster`
    (profiles/cluster.yaml in the repo), with its shared FS and scratch under the test's tmp dir."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "proj"
        self.shared = tmp / "shared"
        self.scratch = tmp / "scratch"
        for c in CELLS:
            path = self.root / "configs" / f"{c}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml_text({"lr": 0.1, "seed": int(c[1:])}))
        (self.root / "profiles").mkdir()

    def profile(self, slurm: dict[str, Any] | None = None, *, omit: bool = False, **top: Any) -> None:
        body: dict[str, Any] = {"transport": "slurm", "shared_fs": str(self.shared),
                                "ckpt_root": str(self.scratch), "python": sys.executable,
                                "slurm": {"time": "4:00:00", "grace": 60, **(slurm or {})}}
        if omit:
            del body["slurm"]
        body.update(top)
        self.profile_text(yaml_text(body, sort_keys=False))

    def profile_text(self, text: str) -> None:
        (self.root / "profiles" / "cluster.yaml").write_text(text)

    def config(self, hosts: dict[str, Any] | None = None, **top: Any) -> None:
        cfg: dict[str, Any] = {
            "profile": "cluster", "sweep": "s1", "workdir": str(self.root),
            "train": "python train.py --config {cfg} --out {ckpt_dir} --resume {resume}",
            "artifacts": {"checkpoint": "model.pt"},
            "tasks": {"t": {"epochs": 2, "cost_per_epoch": 1.0}},
            "cells": [{"glob": "configs/*.yaml", "task": "t"}],
            "hosts": hosts if hosts is not None else {"cluster": {"queues": 3}},
        }
        cfg.update(top)
        (self.root / "ablate.yaml").write_text(yaml_text(cfg, sort_keys=False))

    def files(self) -> dict[str, bytes]:
        """Every file of the project, the shared FS and the scratch ('nothing changed' checks)."""
        base = self.root.parent
        return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


@pytest.fixture
def sp(tmp_path: Path) -> SlurmProject:
    p = SlurmProject(tmp_path)
    p.profile()
    p.config()
    return p


def refused(cli: Cli, sp: SlurmProject, *needles: str) -> str:
    """`ablate plan` refuses with exit 2 and one line holding every needle; nothing is written."""
    before = sp.files()
    r = cli(sp.root, "plan")
    assert r.code == 2, (r.code, r.out, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert sp.files() == before, "a refused plan writes nothing"
    assert not (sp.root / "queues").exists()
    return lines[0]


# --------------------------------------------------------------------------- the slurm: mapping

BAD_SLURM: list[tuple[str, dict[str, Any], list[str]]] = [
    ("unknown key", {"partitoin": "gpu"}, ["slurm.partitoin", "did you mean 'partition'"]),
    ("time not a time", {"time": "abc"}, ["slurm.time", "'abc' is not a Slurm time limit", '"4:00:00"']),
    ("time zero", {"time": "0"}, ["slurm.time", "no limit", "give a limit", "leave time out"]),
    ("time zero H:M:S", {"time": "0:00:00"}, ["slurm.time", "no limit"]),
    ("time a number", {"time": 240}, ["slurm.time", "must be quoted", 'time: "4:00:00"']),
    ("time negative", {"time": "-5"}, ["slurm.time", "not a Slurm time limit"]),
    ("time UNLIMITED", {"time": "UNLIMITED"}, ["slurm.time", "not a Slurm time limit"]),
    ("grace equal to time", {"time": "5:00", "grace": 300}, ["slurm.grace", "300 s is not less than the time limit 5:00 (300 s)", "smaller grace or a longer time"]),
    ("grace above time", {"time": "2:00", "grace": 600}, ["slurm.grace", "not less than the time limit", "smaller grace"]),
    ("grace below 10", {"grace": 5}, ["slurm.grace", "at least 10 seconds", "got 5"]),
    ("grace zero", {"grace": 0}, ["slurm.grace", "at least 10 seconds"]),
    ("grace negative", {"grace": -30}, ["slurm.grace", "at least 10 seconds"]),
    ("grace a bool", {"grace": True}, ["slurm.grace", "at least 10 seconds", "got True"]),
    ("grace a string", {"grace": "2m"}, ["slurm.grace", "at least 10 seconds"]),
    ("extra --job-name", {"extra": ["--job-name=x"]}, ["slurm.extra", "'--job-name=x'", "ablate sets --job-name itself", "slurm: keys"]),
    ("extra -p", {"extra": ["-p"]}, ["slurm.extra", "ablate sets -p itself", "partition"]),
    ("extra -p glued", {"extra": ["-pgpu"]}, ["slurm.extra", "'-pgpu'", "ablate sets -p itself"]),
    ("extra -J glued", {"extra": ["-Jmine"]}, ["slurm.extra", "ablate sets -J itself"]),
    ("extra --requeue", {"extra": ["--requeue"]}, ["slurm.extra", "ablate sets --requeue itself", "requeue"]),
    ("extra --no-requeue", {"extra": ["--no-requeue"]}, ["slurm.extra", "ablate sets --no-requeue itself"]),
    ("extra --signal", {"extra": ["--signal=B:USR1@60"]}, ["slurm.extra", "ablate sets --signal itself"]),
    ("extra --output", {"extra": ["--output=/tmp/x.out"]}, ["slurm.extra", "ablate sets --output itself"]),
    ("extra --gres", {"extra": ["--gres=gpu:2"]}, ["slurm.extra", "ablate sets --gres itself", "gpus"]),
    ("extra --time", {"extra": ["--time=10:00"]}, ["slurm.extra", "ablate sets --time itself"]),
    ("extra --export", {"extra": ["--export=NONE"]}, ["slurm.extra", "ablate sets --export itself"]),
    ("extra --array", {"extra": ["--array=0-3"]}, ["slurm.extra", "ablate sets --array itself"]),
    ("extra abbreviated --partition", {"extra": ["--part=gpu"]}, ["slurm.extra", "'--part=gpu'", "ablate sets --partition itself"]),
    ("extra abbreviated --requeue", {"extra": ["--requ"]}, ["slurm.extra", "ablate sets --requeue itself"]),
    ("extra ambiguous abbreviation", {"extra": ["--par=x"]}, ["slurm.extra", "--parsable / --partition"]),
    ("extra --wait", {"extra": ["--wait"]}, ["slurm.extra", "--wait makes sbatch wait for the whole job", "remove it"]),
    ("extra -W", {"extra": ["-W"]}, ["slurm.extra", "-W makes sbatch wait"]),
    ("extra --test-only", {"extra": ["--test-only"]}, ["slurm.extra", "--test-only makes sbatch submit nothing"]),
    ("extra abbreviated --test-only", {"extra": ["--test"]}, ["slurm.extra", "--test-only makes sbatch submit nothing"]),
    ("extra --clusters", {"extra": ["--clusters=other"]}, ["slurm.extra", "--clusters puts the job on a cluster", "squeue and scancel", "remove it"]),
    ("extra -M", {"extra": ["-Mother"]}, ["slurm.extra", "-M puts the job on a cluster"]),
    ("extra owned after a good one", {"extra": ["--mem=8G", "-t", "5"]}, ["slurm.extra", "ablate sets -t itself"]),
    ("extra not an option", {"extra": ["a100"]}, ["slurm.extra", "'a100' is not one sbatch option word", "--opt=value"]),
    ("extra a value apart", {"extra": ["--constraint", "a100"]}, ["slurm.extra", "'a100' is not one sbatch option word"]),
    ("extra a bare dash", {"extra": ["-"]}, ["slurm.extra", "'-' is not one sbatch option word"]),
    ("extra a double dash", {"extra": ["--"]}, ["slurm.extra", "'--' is not one sbatch option word"]),
    ("extra with a newline", {"extra": ["--comment=a\nb"]}, ["slurm.extra", "holds a control character", "one line"]),
    ("extra with a NUL", {"extra": ["--comment=a\x00b"]}, ["slurm.extra", "holds a control character"]),
    ("extra a value without its option", {"extra": ["=a100"]}, ["slurm.extra", "is not one sbatch option word"]),
    ("extra a string", {"extra": "--constraint=a100"}, ["slurm.extra", "must be a list of sbatch options"]),
    ("extra holds a number", {"extra": [8]}, ["slurm.extra", "must be a list of sbatch options"]),
    ("gpus negative", {"gpus": -1}, ["slurm.gpus", "0 or more", "got -1"]),
    ("gpus a bool", {"gpus": True}, ["slurm.gpus", "0 or more", "got True"]),
    ("gpus a string", {"gpus": "2"}, ["slurm.gpus", "0 or more"]),
    ("gpus a float", {"gpus": 1.5}, ["slurm.gpus", "0 or more"]),
    ("login an option", {"login": "-oProxyCommand"}, ["slurm.login", "ssh alias"]),
    ("login user an option", {"login": "-o@hpc"}, ["slurm.login", "ssh alias"]),
    ("login with a space", {"login": "hpc login"}, ["slurm.login", "ssh alias"]),
    ("login empty", {"login": ""}, ["slurm.login", "non-empty string"]),
    ("partition unsafe", {"partition": "gpu;id"}, ["slurm.partition", "plain Slurm name"]),
    ("partition unsafe in a list", {"partition": ["gpu", "$(id)"]}, ["slurm.partition", "'$(id)'", "plain Slurm name"]),
    ("partition an empty list", {"partition": []}, ["slurm.partition", "a list of them"]),
    ("partition a number", {"partition": 3}, ["slurm.partition", "a list of them"]),
    ("partition an empty name", {"partition": "gpu,,cpu"}, ["slurm.partition", "plain Slurm name"]),
    ("account unsafe", {"account": "$(id)"}, ["slurm.account", "plain Slurm name"]),
    ("qos with a space", {"qos": "high prio"}, ["slurm.qos", "plain Slurm name"]),
    ("requeue a string", {"requeue": "yes"}, ["slurm.requeue", "true or false"]),
    ("resubmit a number", {"resubmit": 1}, ["slurm.resubmit", "true or false"]),
    ("array a string", {"array": "yes"}, ["slurm.array", "true or false"]),
    ("throttle without array", {"throttle": 4}, ["slurm.throttle", "add array: true, or remove throttle"]),
    ("throttle with array false", {"array": False, "throttle": 4}, ["slurm.throttle", "add array: true"]),
    ("throttle zero", {"array": True, "throttle": 0}, ["slurm.throttle", "1 or more", "got 0"]),
    ("throttle a bool", {"array": True, "throttle": True}, ["slurm.throttle", "1 or more", "got True"]),
    ("throttle a string", {"array": True, "throttle": "%4"}, ["slurm.throttle", "1 or more"]),
]


@pytest.mark.parametrize(("case", "slurm", "needles"), BAD_SLURM, ids=[c[0] for c in BAD_SLURM])
def test_bad_slurm_mapping_is_refused_naming_key_and_fix(cli: Cli, sp: SlurmProject, case: str,
                                                         slurm: dict[str, Any], needles: list[str]) -> None:
    sp.profile(slurm)
    refused(cli, sp, "profiles/cluster.yaml", *needles)


def test_unquoted_time_that_yaml_reads_as_a_number_says_quote_it(cli: Cli, sp: SlurmProject) -> None:
    """`time: 4:00:00` unquoted is YAML 1.1's base-60 integer 14400, not the text."""
    sp.profile_text(f"transport: slurm\nshared_fs: {sp.shared}\nckpt_root: {sp.scratch}\n"
                    "slurm:\n  time: 4:00:00\n")
    refused(cli, sp, "slurm.time", "must be quoted", "14400", 'time: "4:00:00"')


def test_slurm_mapping_a_list_is_refused(cli: Cli, sp: SlurmProject) -> None:
    sp.profile_text(f"transport: slurm\nshared_fs: {sp.shared}\nckpt_root: {sp.scratch}\n"
                    "slurm: [gpu]\n")
    refused(cli, sp, "profiles/cluster.yaml", "slurm must be a mapping")


@pytest.mark.parametrize("transport", ["ssh", "local"])
def test_slurm_mapping_on_a_profile_of_another_transport_is_refused(cli: Cli, sp: SlurmProject,
                                                                    transport: str) -> None:
    sp.profile({"partition": "gpu"}, transport=transport)
    sp.config(hosts={"h1": {}})
    refused(cli, sp, "profiles/cluster.yaml", "slurm:", "only a `transport: slurm` profile takes a slurm: mapping")


def test_slurm_transport_without_a_slurm_mapping_loads_with_the_defaults(cli: Cli, sp: SlurmProject) -> None:
    """`slurm:` is optional: the cluster's default partition, account, QOS and time limit, no gres,
    an explicit --requeue, USR2 120 s before the (partition's) limit, resubmit on."""
    sp.profile(omit=True)
    settings = load_project(sp.root).hosts["cluster"].profile.slurm
    assert settings == SlurmSettings()
    assert settings.sbatch_options() == ["--requeue", "--signal=B:USR2@120"]
    got = cli.json(sp.root, "plan")
    assert [q["host"] for q in got["queues"]] == ["cluster"] * 3


def test_null_values_take_the_defaults(sp: SlurmProject) -> None:
    sp.profile({"login": None, "partition": None, "time": None, "gpus": None, "grace": None,
                "extra": None, "requeue": None, "resubmit": None, "array": None, "throttle": None})
    assert load_project(sp.root).profile.slurm == SlurmSettings()


def test_an_array_with_a_throttle_submits_through_new_array(sp: SlurmProject) -> None:
    """`array: true` (+ `throttle`): a launch of several queues here is one `new-array` of the
    session adapter, its throttle first; one queue, or no array, is a job of its own."""
    from ablate.transport.local import LocalHost
    from ablate.transport.slurm import SlurmHost

    sp.profile({"array": True, "throttle": 3})
    settings = load_project(sp.root).profile.slurm
    assert settings is not None and settings.array and settings.throttle == 3
    host = SlurmHost("cluster", LocalHost("cluster"), settings, "/out")
    argv = host.array_argv([("q-a", "bash a"), ("q-b", "bash b")])
    assert argv is not None and argv[argv.index("new-array"):] == ["new-array", "3", "q-a", "bash a", "q-b", "bash b"]
    assert host.array_argv([("q-a", "bash a")]) is None
    sp.profile({"array": True})
    plain = load_project(sp.root).profile.slurm
    assert plain is not None and plain.throttle is None
    argv = SlurmHost("cluster", LocalHost("cluster"), plain, "/out").array_argv([("q-a", "a"), ("q-b", "b")])
    assert argv is not None and argv[argv.index("new-array") + 1] == "0"
    assert SlurmHost("cluster", LocalHost("cluster"), SlurmSettings(), "/out").array_argv([("q-a", "a"), ("q-b", "b")]) is None


# --------------------------------------------------------------------------- hosts in ablate.yaml

SVC = {"name": "srv", "command": "serve --port {port}", "port": 8000,
       "ready": {"http": "http://127.0.0.1:{port}/h"}}
BAD_HOSTS: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    ("slurm host with gpus", {"cluster": {"gpus": [0, 1]}}, {}, ["hosts.cluster.gpus", "a Slurm host has no GPU list", "queues: N", "slurm.gpus"]),
    ("slurm host with slots", {"cluster": {"slots": 2}}, {}, ["hosts.cluster.slots", "a Slurm host has no GPU list", "queues: N"]),
    ("slurm host with queues and gpus", {"cluster": {"queues": 2, "gpus": [0]}}, {}, ["hosts.cluster.gpus", "queues: N"]),
    ("queues zero", {"cluster": {"queues": 0}}, {}, ["hosts.cluster.queues", "positive whole number"]),
    ("queues a bool", {"cluster": {"queues": True}}, {}, ["hosts.cluster.queues", "positive whole number"]),
    ("queues a string", {"cluster": {"queues": "4"}}, {}, ["hosts.cluster.queues", "positive whole number"]),
    ("ssh host with queues", {"cluster": {"queues": 2}, "box": {"profile": "bare", "queues": 2}}, {}, ["hosts.box.queues", "only a host of a `transport: slurm` profile takes queues: N", "gpus: [...] or slots: N"]),
    ("local host with queues", {"cluster": {"queues": 2}, "here": {"profile": "local", "queues": 2}}, {}, ["hosts.here.queues", "only a host of a `transport: slurm` profile"]),
    ("slurm host says ssh", {"cluster": {"transport": "ssh"}}, {}, ["hosts.cluster.transport", "a Slurm host takes its transport from its profile", "set `profile:`"]),
    ("ssh host says slurm", {"cluster": {}, "box": {"profile": "bare", "transport": "slurm"}}, {}, ["hosts.box.transport", "takes its transport from its profile"]),
    ("slurm host with ssh", {"cluster": {"queues": 2, "ssh": "hpc-login"}}, {}, ["hosts.cluster.ssh", "slurm.login", "remove hosts.cluster.ssh"]),
    ("slurm host with instance_id", {"cluster": {"instance_id": "x1"}}, {}, ["hosts.cluster.instance_id", "no instance to release"]),
    ("slurm host with a service on a GPU", {"cluster": {"queues": 2}}, {"services": [{**SVC, "gpus": 1}], "train": "python t.py --config {cfg} --port {port}"}, ["cluster", "services", "not supported on a Slurm host"]),
]


@pytest.mark.parametrize(("case", "hosts", "top", "needles"), BAD_HOSTS, ids=[c[0] for c in BAD_HOSTS])
def test_bad_slurm_host_is_refused_naming_key_and_fix(cli: Cli, sp: SlurmProject, case: str,
                                                      hosts: dict[str, Any], top: dict[str, Any],
                                                      needles: list[str]) -> None:
    sp.config(hosts=hosts, **top)
    refused(cli, sp, "ablate.yaml", *needles)


def test_slurm_host_with_a_service_on_no_gpu_is_refused(cli: Cli, sp: SlurmProject) -> None:
    sp.config(services=[SVC], train="python t.py --config {cfg} --port {port}")
    refused(cli, sp, "ablate.yaml", "cluster", "services", "not supported on a Slurm host")


# --------------------------------------------------------------------------- a good project


def test_plan_gives_n_queues_for_a_slurm_host_of_queues_n(cli: Cli, sp: SlurmProject) -> None:
    sp.config(hosts={"cluster": {"queues": 4}})
    got = cli.json(sp.root, "plan")
    queues = got["queues"]
    assert [q["host"] for q in queues] == ["cluster"] * 4
    assert sorted(q["slot"] for q in queues) == [0, 1, 2, 3]  # slots number the jobs, not GPUs
    assert sorted(c for q in queues for c in q["cells"]) == CELLS
    assert all(len(q["cells"]) in (1, 2) for q in queues), queues  # balanced: 6 equal cells over 4
    written = sorted(p.name for p in (sp.root / "queues").glob("*.txt"))
    assert written == sorted(f"{q['queue']}.txt" for q in queues)
    host = load_project(sp.root).hosts["cluster"]
    assert host.transport == "slurm" and host.slots == (0, 1, 2, 3) and not host.pins_gpus


def test_a_slurm_host_without_queues_is_one_queue(cli: Cli, sp: SlurmProject) -> None:
    sp.config(hosts={"cluster": {"speed": 2.0}})
    got = cli.json(sp.root, "plan")
    assert [q["host"] for q in got["queues"]] == ["cluster"]


def test_sbatch_options_are_explicit_and_in_order(sp: SlurmProject) -> None:
    sp.profile({"login": "me@hpc-login", "partition": "gpu", "account": "lab1", "qos": "normal",
                "time": "1-00:00:00", "gpus": 2, "grace": 300,
                "extra": ["--constraint=a100", "--mem=64G", "-c8"]})
    s = load_project(sp.root).profile.slurm
    assert s is not None and s.login == "me@hpc-login" and s.time_seconds == 86400
    assert s.sbatch_options() == [
        "--partition=gpu", "--account=lab1", "--qos=normal", "--time=1-00:00:00", "--gres=gpu:2",
        "--requeue", "--signal=B:USR2@300", "--constraint=a100", "--mem=64G", "-c8"]


@pytest.mark.parametrize("partition", [["gpu", "gpu-long"], "gpu,gpu-long", "gpu, gpu-long"])
def test_partition_takes_a_list_as_slurm_does(sp: SlurmProject, partition: object) -> None:
    sp.profile({"partition": partition})
    s = load_project(sp.root).profile.slurm
    assert s is not None and s.sbatch_options()[0] == "--partition=gpu,gpu-long"


def test_extra_takes_any_value_slurm_does_as_one_argument(sp: SlurmProject) -> None:
    """Constraints with `|` `&` `[]` `*`, a comment with spaces and shell syntax: each reaches
    sbatch as one argument (quoted on the way: tests/test_slurm_submission.py submits them for real)."""
    extra = ["--constraint=[a100|h100]&ib*2", "--comment=my run; $(id) `id` 'q' \"dq\"",
             "--nodelist=n[1-4]", "-Cgpu", "--mail-user=me@example.org"]
    sp.profile({"extra": extra})
    s = load_project(sp.root).profile.slurm
    assert s is not None and s.sbatch_options()[-len(extra):] == extra


def test_no_gres_without_gpus_and_an_explicit_no_requeue(sp: SlurmProject) -> None:
    sp.profile({"time": "30", "gpus": 0, "grace": 10, "requeue": False, "resubmit": False})
    s = load_project(sp.root).profile.slurm
    assert s is not None and s.time_seconds == 30 * 60
    opts = s.sbatch_options()
    assert opts == ["--time=30", "--no-requeue", "--signal=B:USR2@10"]
    assert not any(o.startswith("--gres") for o in opts)
    assert not any("USR1" in o for o in opts)  # never USR1: NCCL's


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90 * 60), ("10:30", 630), ("2:00:00", 7200), ("1-12", 36 * 3600),
    ("1-2:30", (26 * 60 + 30) * 60), ("2-00:00:05", 2 * 86400 + 5),
])
def test_every_slurm_time_format_is_read(sp: SlurmProject, text: str, seconds: int) -> None:
    sp.profile({"time": text, "grace": 10})
    s = load_project(sp.root).profile.slurm
    assert s is not None and s.time_seconds == seconds


# --------------------------------------------------------------------------- the shipped profile


def test_shipped_slurm_profile_loads_with_every_key_commented(tmp_path: Path) -> None:
    text = shipped_profiles()["slurm"]
    p = load_profile("slurm", tmp_path, "t")
    assert p.transport == "slurm" and p.slurm is not None
    assert p.slurm.requeue and p.slurm.resubmit and p.slurm.gpus >= 1 and p.slurm.time
    assert not p.ckpt_root.startswith(p.shared_fs + "/") and p.ckpt_root != p.shared_fs
    data = yaml.safe_load(text)
    assert set(data["slurm"]) == SLURM_KEYS, "the example shows every key"
    lines = text.splitlines()
    for key in sorted(SLURM_KEYS):
        i = next(k for k, line in enumerate(lines) if line.startswith(f"  {key}:"))
        assert "#" in lines[i] or lines[i - 1].lstrip().startswith("#"), (key, lines[i])
    # why the checkpoints go to shared scratch: a requeued job may land on another node
    assert "another node" in text and "resum" in text
    assert "USR2" in text and "--no-requeue" in text


def test_a_slurm_project_without_workdir_names_the_compute_nodes(cli: Cli, sp: SlurmProject) -> None:
    sp.config(workdir=None)
    text = (sp.root / "ablate.yaml").read_text().replace("workdir: null\n", "")
    (sp.root / "ablate.yaml").write_text(text)
    refused(cli, sp, "workdir", "is required for hosts that are not this machine (cluster)", "compute nodes")
