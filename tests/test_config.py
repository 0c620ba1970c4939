"""Every bad input for ablate.yaml, profiles and queue lines is refused with exit 2 and a message
naming the file, the key (or line) and why. Plus the shipped profiles and the example queue."""

# The case tables below keep one case per line, which reads better than wrapping them.
# ruff: noqa: E501

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.config.project import Profile, load_profile, load_project, parse_size, shipped_profiles
from ablate.errors import ConfigError, QueueError
from ablate.sweep import cells
from tests.helpers.cli import Cli
from tests.helpers.project import TRAIN, LocalProject, refused

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- ablate.yaml

SVC = {"name": "srv", "command": "serve --port {port}", "port": 8000, "ready": {"http": "http://127.0.0.1:{port}/h"}}
BAD_CONFIGS: list[tuple[str, dict[str, Any], list[str]]] = [
    # unknown keys, with did-you-mean, at every level
    ("top-level typo", {"hostz": {"h1": {}}}, ["ablate.yaml", "unknown key hostz", "did you mean 'hosts'"]),
    ("host key typo", {"hosts": {"h1": {"sped": 1.0}}}, ["hosts.h1.sped", "did you mean 'speed'"]),
    ("task key typo", {"tasks": {"recon": {"epoch": 3}}}, ["tasks.recon.epoch", "did you mean 'epochs'"]),
    ("artifacts typo", {"artifacts": {"checkpont": "a.pt"}}, ["artifacts.checkpont", "did you mean"]),
    ("budget typo", {"budget": {"ckpt_sise": "1GB"}}, ["budget.ckpt_sise", "did you mean 'ckpt_size'"]),
    ("cells typo", {"cells": [{"glop": "c/*.yaml", "task": "recon"}]}, ["cells[0].glop", "did you mean 'glob'"]),
    # missing required keys
    ("no sweep", {"sweep": None}, ["sweep: is required"]),
    ("no train", {"train": None}, ["train: is required"]),
    ("no checkpoint", {"artifacts": {"metrics": "m.json"}}, ["artifacts.checkpoint: is required"]),
    ("no tasks", {"tasks": None}, ["tasks"]),
    ("empty tasks", {"tasks": {}}, ["tasks"]),
    ("no hosts", {"hosts": None}, ["hosts", "at least one host"]),
    ("task without epochs", {"tasks": {"recon": {"cost_per_epoch": 1.0}}}, ["tasks.recon.epochs: is required"]),
    ("cell without task", {"cells": [{"glob": "c/*.yaml"}]}, ["cells[0].task: is required"]),
    ("cell without glob", {"cells": [{"task": "recon"}]}, ["cells[0].glob: is required"]),
    # wrong types
    ("sweep a number", {"sweep": 12}, ["sweep", "non-empty string"]),
    ("sweep unsafe", {"sweep": "a/b"}, ["sweep", "plain name"]),
    ("sweep with $", {"sweep": "$(x)"}, ["sweep", "plain name"]),
    ("train a list", {"train": ["python", "x"]}, ["train", "non-empty string"]),
    ("hosts a list", {"hosts": ["h1"]}, ["hosts"]),
    ("host settings a string", {"hosts": {"h1": "fast"}}, ["hosts.h1", "must be a mapping"]),
    ("tasks a list", {"tasks": ["recon"]}, ["tasks"]),
    ("task spec a number", {"tasks": {"recon": 3}}, ["tasks.recon", "must be a mapping"]),
    ("cells a mapping", {"cells": {"glob": "x"}}, ["cells", "must be a list"]),
    ("cell a string", {"cells": ["c/*.yaml"]}, ["cells[0]", "must be a mapping"]),
    ("artifacts a string", {"artifacts": "best.pth"}, ["artifacts", "must be a mapping"]),
    ("metrics_keys a string", {"artifacts": {"checkpoint": "a.pt", "metrics": "m.json", "metrics_keys": "val"}},
     ["artifacts.metrics_keys", "list"]),
    ("metrics_keys without metrics", {"artifacts": {"checkpoint": "a.pt", "metrics_keys": ["val"]}},
     ["artifacts.metrics_keys", "artifacts.metrics"]),
    ("speed a string", {"hosts": {"h1": {"speed": "fast"}}}, ["hosts.h1.speed", "number"]),
    ("speed a bool", {"hosts": {"h1": {"speed": True}}}, ["hosts.h1.speed", "number"]),
    ("speed zero", {"hosts": {"h1": {"speed": 0}}}, ["hosts.h1.speed", "> 0"]),
    ("speed negative", {"hosts": {"h1": {"speed": -1.0}}}, ["hosts.h1.speed", "> 0"]),
    ("speed infinite", {"hosts": {"h1": {"speed": float("inf")}}}, ["hosts.h1.speed", "finite"]),
    ("speed NaN", {"hosts": {"h1": {"speed": float("nan")}}}, ["hosts.h1.speed"]),
    ("epochs zero", {"tasks": {"recon": {"epochs": 0}}}, ["tasks.recon.epochs", "positive whole number"]),
    ("epochs negative", {"tasks": {"recon": {"epochs": -3}}}, ["tasks.recon.epochs", "positive whole number"]),
    ("epochs a float", {"tasks": {"recon": {"epochs": 2.5}}}, ["tasks.recon.epochs", "positive whole number"]),
    ("epochs a string", {"tasks": {"recon": {"epochs": "ten"}}}, ["tasks.recon.epochs", "positive whole number"]),
    ("cost zero", {"tasks": {"recon": {"epochs": 1, "cost_per_epoch": 0}}}, ["tasks.recon.cost_per_epoch"]),
    ("cost a string", {"tasks": {"recon": {"epochs": 1, "cost_per_epoch": "1"}}},
     ["tasks.recon.cost_per_epoch", "number"]),
    ("cell epochs zero", {"cells": [{"glob": "c/*.yaml", "task": "recon", "epochs": 0}]}, ["cells[0].epochs"]),
    ("heartbeat a fraction", {"heartbeat_secs": 0.5}, ["heartbeat_secs", "whole number"]),
    ("heartbeat zero", {"heartbeat_secs": 0}, ["heartbeat_secs"]),
    ("resources a list", {"resources": ["A100"]}, ["resources", "mapping"]),
    ("candidates a string", {"candidates": "autodl"}, ["candidates", "list of profile names"]),
    ("unknown candidate", {"candidates": ["autodll"]}, ["candidates", "unknown profile 'autodll'",
                                                        "did you mean 'autodl'"]),
    # bad sizes
    ("size garbage", {"budget": {"ckpt_size": "lots"}}, ["budget.ckpt_size", "size like"]),
    ("size negative", {"budget": {"ckpt_size": -1}}, ["budget.ckpt_size", "non-negative"]),
    ("size negative string", {"budget": {"scratch": "-2GB"}}, ["budget.scratch"]),
    ("size bad unit", {"budget": {"scratch": "2PB"}}, ["budget.scratch"]),
    ("size bool", {"budget": {"scratch": True}}, ["budget.scratch"]),
    ("size infinite", {"budget": {"scratch": float("inf")}}, ["budget.scratch"]),
    ("inodes zero", {"budget": {"inodes_per_cell": 0}}, ["budget.inodes_per_cell"]),
    # unsafe names and paths
    ("task name unsafe", {"tasks": {"re con": {"epochs": 1}}}, ["tasks.re con", "plain names"]),
    ("task name with ;", {"tasks": {"a;b": {"epochs": 1}}}, ["tasks.a;b"]),
    ("host name unsafe", {"hosts": {"h1;rm": {}}}, ["hosts.h1;rm", "plain names"]),
    ("host name ..", {"hosts": {"..": {}}}, ["hosts..."]),
    ("ssh alias unsafe", {"hosts": {"h1": {"ssh": "$(reboot)"}}}, ["hosts.h1.ssh", "ssh alias"]),
    ("ssh with space", {"hosts": {"h1": {"ssh": "a b"}}}, ["hosts.h1.ssh"]),
    ("instance_id unsafe", {"hosts": {"h1": {"instance_id": "x; rm -rf /"}}}, ["hosts.h1.instance_id"]),
    ("instance_id a bool", {"hosts": {"h1": {"instance_id": True}}}, ["hosts.h1.instance_id"]),
    ("workdir unsafe", {"workdir": "/x/$(id)"}, ["workdir", "shell"]),
    ("workdir with space", {"workdir": "/x/my repo"}, ["workdir"]),
    ("checkpoint absolute", {"artifacts": {"checkpoint": "/etc/passwd"}}, ["artifacts.checkpoint", "relative"]),
    ("checkpoint escapes", {"artifacts": {"checkpoint": "../x.pt"}}, ["artifacts.checkpoint"]),
    ("checkpoint unsafe", {"artifacts": {"checkpoint": "a;b.pt"}}, ["artifacts.checkpoint"]),
    ("checkpoint with space", {"artifacts": {"checkpoint": "my model.pt"}}, ["artifacts.checkpoint"]),
    ("checkpoint list escapes", {"artifacts": {"checkpoint": ["a.pt", "x/../../b.pt"]}},
     ["artifacts.checkpoint", "'x/../../b.pt'"]),
    ("checkpoint empty list", {"artifacts": {"checkpoint": []}}, ["artifacts.checkpoint", "list"]),
    ("checkpoint a number", {"artifacts": {"checkpoint": 3}}, ["artifacts.checkpoint"]),
    ("checkpoint the ckpt dir", {"artifacts": {"checkpoint": "./"}}, ["artifacts.checkpoint"]),
    ("pick unknown", {"artifacts": {"checkpoint": "e*.ckpt", "pick": "latest"}},
     ["artifacts.pick", "all", "newest", "'latest'"]),
    # artifacts.verify (issue 32): one check for every entry, or {entry: check}
    ("verify unknown check", {"artifacts": {"checkpoint": "a.pt", "verify": "loaded"}},
     ["artifacts.verify: 'loaded' (did you mean 'load'?) is not a check", "write load, structure, hash", "{entry: check}"]),
    ("verify a list", {"artifacts": {"checkpoint": "a.pt", "verify": ["hash"]}},
     ["artifacts.verify: ['hash'] is not a check", "load, structure, hash"]),
    ("verify a YAML boolean", {"artifacts": {"checkpoint": "a.pt", "verify": False}},
     ["artifacts.verify: False is not a check"]),
    ("verify a number", {"artifacts": {"checkpoint": "a.pt", "verify": 3}}, ["artifacts.verify: 3 is not a check"]),
    ("verify key no entry", {"artifacts": {"checkpoint": ["trainer/checkpoint-*", "w.h5"], "verify": {"trainer/checkpoint*": "structure"}}},
     ["artifacts.verify: 'trainer/checkpoint*' is not a checkpoint entry", "did you mean 'trainer/checkpoint-*'", "(trainer/checkpoint-*, w.h5)"]),
    ("verify key a file under an entry", {"artifacts": {"checkpoint": "hf", "verify": {"hf/model.safetensors": "hash"}}},
     ["artifacts.verify: 'hf/model.safetensors' is not a checkpoint entry", "entries of artifacts.checkpoint (hf)"]),
    ("verify key a number", {"artifacts": {"checkpoint": "a.pt", "verify": {1: "hash"}}},
     ["artifacts.verify: 1 is not a checkpoint entry"]),
    ("verify entry bad check", {"artifacts": {"checkpoint": ["a.pt", "w.h5"], "verify": {"w.h5": "sha256"}}},
     ["artifacts.verify: w.h5: 'sha256' is not a check", "load, structure, hash"]),
    ("verify entry a mapping", {"artifacts": {"checkpoint": "w.h5", "verify": {"w.h5": {"how": "hash"}}}},
     ["artifacts.verify: w.h5: {'how': 'hash'} is not a check"]),
    ("verify entry empty", {"artifacts": {"checkpoint": "w.h5", "verify": {"w.h5": None}}},
     ["artifacts.verify: w.h5: None is not a check"]),
    ("cells priority text", {"cells": [{"glob": "c/*.yaml", "task": "recon", "priority": "high"}]},
     ["cells[0].priority", "whole number"]),
    # services
    ("services a mapping", {"services": {"name": "x"}}, ["services", "must be a list"]),
    ("service name upper", {"services": [{**SVC, "name": "vLLM"}]}, ["services[0].name", "lower-case"]),
    ("service twice", {"services": [SVC, {**SVC, "port": 9000}]}, ["services[1].name", "names two"]),
    ("service unknown field", {"services": [{**SVC, "command": "serve --gpu {gpus}"}]},
     ["services[0].command", "unknown field {gpus}", "did you mean"]),
    ("service port low", {"services": [{**SVC, "port": 80}]}, ["services[0].port", "1024"]),
    ("service scope", {"services": [{**SVC, "scope": "sweep"}]}, ["services[0].scope", "queue", "cell"]),
    ("service no ready", {"services": [{k: v for k, v in SVC.items() if k != "ready"}]}, ["services[0].ready"]),
    ("service both ready", {"services": [{**SVC, "ready": {"http": "http://h:1/", "cmd": "true"}}]},
     ["services[0].ready.http", "exactly one"]),
    ("service ready url", {"services": [{**SVC, "ready": {"http": "http://x/$(id)"}}]},
     ["services[0].ready.http", "plain http"]),
    ("service gpus", {"services": [{**SVC, "gpus": -1}]}, ["services[0].gpus"]),
    ("service ports close", {"services": [SVC, {**SVC, "name": "b", "port": 8004}]},
     ["services", "closer than 16"]),
    ("service gpus exceed host", {"services": [{**SVC, "gpus": 2}], "hosts": {"h1": {"gpus": [0, 1]}}},
     ["hosts.h1.gpus", "each queue takes 3"]),
    ("train port without services", {"train": "python t.py --config {cfg} --port {port}"},
     ["train", "unknown field {port}"]),
    ("train port of unknown service", {"services": [SVC], "train": "python t.py --config {cfg} {port_vllm}"},
     ["train", "unknown field {port_vllm}"]),
    ("glob absolute", {"cells": [{"glob": "/etc/*.yaml", "task": "recon"}]}, ["cells[0].glob", "relative"]),
    ("glob escapes", {"cells": [{"glob": "../x/*.yaml", "task": "recon"}]}, ["cells[0].glob", "inside"]),
    ("glob unsafe", {"cells": [{"glob": "c/$(x)*.yaml", "task": "recon"}]}, ["cells[0].glob", "shell"]),
    ("profile name unsafe", {"profile": "../x"}, ["profile", "plain name"]),
    # unknown references
    ("unknown task in cells", {"cells": [{"glob": "c/*.yaml", "task": "recn"}]},
     ["cells[0].task", "'recn'", "did you mean 'recon'"]),
    ("unknown profile", {"profile": "autodll"}, ["unknown profile 'autodll'", "did you mean 'autodl'", "shipped:"]),
    ("unknown host profile", {"hosts": {"h1": {"profile": "nope"}}}, ["hosts.h1.profile", "unknown profile"]),
    ("bad transport", {"hosts": {"h1": {"transport": "carrier-pigeon"}}}, ["hosts.h1.transport", "local, ssh"]),
    # train template
    ("train unknown field", {"train": "python t.py --config {cfg} --lr {lr}"},
     ["train", "unknown field {lr}"]),
    ("train typo field", {"train": "python t.py --config {cfg} --out {ckpt_dri}"},
     ["train", "{ckpt_dri}", "did you mean 'ckpt_dir'"]),
    ("train format spec", {"train": "python t.py --config {cfg!r}"}, ["train", "unknown field"]),
    ("train without cfg", {"train": "python t.py --epochs {epochs}"}, ["train", "{cfg}"]),
    ("train over lines", {"train": "python t.py --config {cfg}\nrm -rf /\n"}, ["train", "several lines"]),
    ("train with CR", {"train": "python t.py --config {cfg}\r"}, ["train", "carriage return"]),
    # gpus malformed
    ("gpus a string", {"hosts": {"h1": {"gpus": "0,1"}}}, ["hosts.h1.gpus", "list of GPU indices"]),
    ("gpus empty", {"hosts": {"h1": {"gpus": []}}}, ["hosts.h1.gpus"]),
    ("gpus negative", {"hosts": {"h1": {"gpus": [-1]}}}, ["hosts.h1.gpus"]),
    ("gpus strings", {"hosts": {"h1": {"gpus": ["0"]}}}, ["hosts.h1.gpus"]),
    ("gpus bools", {"hosts": {"h1": {"gpus": [True]}}}, ["hosts.h1.gpus"]),
    ("gpus twice", {"hosts": {"h1": {"gpus": [0, 0]}}}, ["hosts.h1.gpus", "twice"]),
    ("gpus and slots", {"hosts": {"h1": {"gpus": [0], "slots": 2}}}, ["hosts.h1.slots", "not both"]),
    ("slots zero", {"hosts": {"h1": {"slots": 0}}}, ["hosts.h1.slots"]),
    # ssh hosts need an absolute workdir
    ("ssh host without workdir", {"hosts": {"h1": {"transport": "ssh"}}}, ["workdir", "is required", "h1"]),
    ("ssh host relative workdir", {"workdir": "code/proj", "hosts": {"h1": {"transport": "ssh"}}},
     ["workdir", "absolute"]),
    ("stop_grace a word", {"stop_grace": "long"}, ["ablate.yaml: stop_grace", "a duration like 30m"]),
    ("stop_grace zero", {"stop_grace": 0}, ["stop_grace", "positive number of seconds"]),
    ("stop_grace a bool", {"stop_grace": True}, ["stop_grace", "a duration"]),
]


@pytest.mark.parametrize(("case", "overrides", "needles"), BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_refused_naming_file_and_key(local_project: LocalProject, case: str,
                                                   overrides: dict[str, Any], needles: list[str]) -> None:
    cfg = local_project.config(**overrides)
    for key in [k for k, v in overrides.items() if v is None]:
        del cfg[key]
    (local_project.root / "ablate.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    refused(local_project, "ablate.yaml", *needles)


RAW_BAD: list[tuple[str, str, list[str]]] = [
    ("invalid YAML", "sweep: t1\nhosts: {h1: {speed: 1.0}\ntrain: x\n", ["ablate.yaml", "line", "invalid YAML"]),
    ("tab indentation", "sweep: t1\nhosts:\n\th1: {}\n", ["ablate.yaml: line 3", "invalid YAML"]),
    ("duplicate key", "sweep: t1\nsweep: t2\n", ["ablate.yaml: line 2", "'sweep' is given twice"]),
    ("duplicate host", "sweep: t1\nhosts:\n  h1: {}\n  h1: {speed: 2}\n", ["line 4", "'h1' is given twice"]),
    ("top level a list", "- sweep\n- t1\n", ["ablate.yaml", "top level must be a mapping"]),
    ("top level a string", "just text\n", ["ablate.yaml", "top level must be a mapping"]),
    ("empty file", "", ["ablate.yaml", "is empty", "ablate init"]),
    ("comments only", "# nothing here\n", ["ablate.yaml", "is empty"]),
]


@pytest.mark.parametrize(("case", "text", "needles"), RAW_BAD, ids=[c[0] for c in RAW_BAD])
def test_bad_yaml_is_refused_with_file_and_line(local_project: LocalProject, case: str, text: str,
                                                needles: list[str]) -> None:
    (local_project.root / "ablate.yaml").write_text(text)
    refused(local_project, *needles)


def test_invalid_yaml_reports_the_right_line(local_project: LocalProject) -> None:
    text = (local_project.root / "ablate.yaml").read_text().splitlines()
    text.insert(3, "  bad: [unclosed")
    (local_project.root / "ablate.yaml").write_text("\n".join(text) + "\n")
    msg = refused(local_project, "invalid YAML")
    assert "line 4" in msg or "line 5" in msg


def test_non_utf8_config_is_refused(local_project: LocalProject) -> None:
    (local_project.root / "ablate.yaml").write_bytes(b"sweep: caf\xe9\n")
    refused(local_project, "ablate.yaml", "cannot read")


def test_missing_config_says_run_init(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_project(tmp_path)
    assert ei.value.exit_code == 2 and "ablate init" in ei.value.message


def test_crlf_config_loads_without_carriage_returns(local_project: LocalProject) -> None:
    path = local_project.root / "ablate.yaml"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    project = load_project(local_project.root)
    assert "\r" not in project.train and project.sweep == "t1"


def test_good_config_loads(local_project: LocalProject) -> None:
    local_project.write_config(hosts={"h1": {"speed": 1.5, "gpus": [0, 2], "instance_id": 123}},
                               budget={"ckpt_size": "2GiB", "scratch": "500MB"}, heartbeat_secs=5,
                               cells=[{"glob": "configs/**/*.yaml", "task": "det", "epochs": 7}])
    p = load_project(local_project.root)
    assert p.hosts["h1"].slots == (0, 2) and p.hosts["h1"].speed == 1.5
    assert p.hosts["h1"].instance_id == "123"
    assert p.budget.ckpt_size == 2 * 1024**3 and p.budget.scratch == 500 * 10**6
    assert p.heartbeat_secs == 5 and p.train == TRAIN
    assert p.cells[0].epochs == 7 and p.cells[0].task == "det"
    assert p.artifacts.checkpoint == ("model.safetensors",) and p.artifacts.pick == "all"


@pytest.mark.parametrize(("value", "seconds"), [(None, 120.0), ("10m", 600.0), (45, 45.0), ("90s", 90.0)])
def test_stop_grace_is_a_duration_and_reaches_the_run_spec(local_project: LocalProject, value: object,
                                                           seconds: float) -> None:
    from ablate.run.placement import render_spec

    local_project.write_config(**({} if value is None else {"stop_grace": value}))
    project = load_project(local_project.root)
    assert project.monitor.stop_grace == seconds
    spec = render_spec(project, project.hosts["h1"], "/x/run_one.sh").decode()
    # every spec carries it, the default too: run_queue keeps no default of its own (issue 42)
    assert f"ABLATE_STOP_GRACE={int(seconds)}\n" in spec


def test_checkpoint_may_be_a_glob_a_directory_or_a_list(local_project: LocalProject) -> None:
    local_project.write_config(artifacts={"checkpoint": ["hf/model*.safetensors*", "hf/config.json",
                                                         "global_step*/", "hf/config.json"],
                                          "pick": "newest"})
    a = load_project(local_project.root).artifacts
    assert a.checkpoint == ("hf/model*.safetensors*", "hf/config.json", "global_step*")
    assert a.pick == "newest"


def test_verify_one_check_applies_to_every_checkpoint_entry(local_project: LocalProject) -> None:
    local_project.write_config(artifacts={"checkpoint": ["trainer/checkpoint-*", "weights.h5"], "verify": "hash"})
    a = load_project(local_project.root).artifacts
    assert a.verify == (("trainer/checkpoint-*", "hash"), ("weights.h5", "hash"))


def test_verify_per_entry_keys_are_entries_as_configured(local_project: LocalProject) -> None:
    # A key is normalised as its entry is (`global_step*/` is the entry `global_step*`); entries
    # not named keep the strongest check that applies (absent from the mapping).
    local_project.write_config(artifacts={
        "checkpoint": ["trainer/checkpoint-*", "global_step*/", "latest", "weights.h5"], "pick": "newest",
        "verify": {"trainer/checkpoint-*": "structure", "global_step*/": "load", "weights.h5": "hash"}})
    a = load_project(local_project.root).artifacts
    assert a.checkpoint == ("trainer/checkpoint-*", "global_step*", "latest", "weights.h5")
    assert dict(a.verify) == {"trainer/checkpoint-*": "structure", "global_step*": "load", "weights.h5": "hash"}


def test_without_verify_the_artifacts_argument_is_as_before(local_project: LocalProject) -> None:
    """The verify probe's argument carries `verify` only when ablate.yaml sets it: a project without
    the key passes exactly what it passed before issue 32, and its run spec does not change."""
    from ablate.results.common import artifacts_arg
    from ablate.run.placement import render_spec

    local_project.write_config(artifacts={"checkpoint": "model.safetensors", "metrics": "metrics.json",
                                          "metrics_keys": ["val_loss"]})
    before = load_project(local_project.root)
    assert before.artifacts.verify == ()
    assert artifacts_arg(before) == {"checkpoint": ["model.safetensors"], "pick": "all",
                                     "metrics": "metrics.json", "metrics_keys": ["val_loss"]}
    local_project.write_config(artifacts={"checkpoint": "model.safetensors", "metrics": "metrics.json",
                                          "metrics_keys": ["val_loss"], "verify": {"model.safetensors": "structure"}})
    after = load_project(local_project.root)
    assert artifacts_arg(after) == {**artifacts_arg(before), "verify": {"model.safetensors": "structure"}}
    # how a result is checked is no part of how it is made: the run spec (its content address) stays
    assert render_spec(after, after.hosts["h1"], "/r1") == render_spec(before, before.hosts["h1"], "/r1")
    local_project.write_config(artifacts={"checkpoint": "model.safetensors", "verify": {}})
    assert "verify" not in artifacts_arg(load_project(local_project.root))


def test_a_bad_verify_is_exit_2_on_the_command_line(local_project: LocalProject, cli: Cli) -> None:
    local_project.write_config(artifacts={"checkpoint": "model.safetensors", "verify": "strict"})
    before = local_project.snapshot()
    r = cli(local_project, "reconcile", "--json")
    assert r.code == 2 and "artifacts.verify: 'strict'" in r.err and len(r.err.strip().splitlines()) == 1
    assert "artifacts.verify" in r.json()["error"]
    assert local_project.snapshot() == before  # nothing changed


@pytest.mark.parametrize(("value", "expected"), [
    ("2GB", 2 * 10**9), ("2 gb", 2 * 10**9), ("500MB", 5 * 10**8), ("1.5G", 1_500_000_000),
    ("2GiB", 2 * 1024**3), ("10KiB", 10240), (1024, 1024), ("0", 0), ("7", 7), ("3T", 3 * 10**12),
])
def test_parse_size(value: object, expected: int) -> None:
    assert parse_size(value, "k") == expected


# --------------------------------------------------------------------------- profiles


def _profile(p: LocalProject, name: str, body: str) -> None:
    (p.root / "profiles").mkdir(exist_ok=True)
    (p.root / "profiles" / f"{name}.yaml").write_text(body)


BAD_PROFILES: list[tuple[str, str, list[str]]] = [
    ("unknown key", "shared_fs: /a\nckpt_root: /b\nshared: /c\n", ["unknown key shared", "did you mean 'shared_fs'"]),
    ("no shared_fs", "ckpt_root: /b\n", ["shared_fs: is required"]),
    ("no ckpt_root", "shared_fs: /a\n", ["ckpt_root: is required"]),
    ("relative shared_fs", "shared_fs: mnt/a\nckpt_root: /b\n", ["shared_fs", "absolute"]),
    ("relative ckpt_root", "shared_fs: /a\nckpt_root: tmp/b\n", ["ckpt_root", "absolute"]),
    ("unsafe shared_fs", "shared_fs: /a/$(id)\nckpt_root: /b\n", ["shared_fs", "shell"]),
    ("space in ckpt_root", "shared_fs: /a\nckpt_root: /my ckpt\n", ["ckpt_root", "shell"]),
    ("bad transport", "transport: ftp\nshared_fs: /a\nckpt_root: /b\n", ["transport", "local, ssh"]),
    ("release unknown field", "shared_fs: /a\nckpt_root: /b\nrelease: vastai destroy instance {id}\n",
     ["release", "unknown field {id}"]),
    ("release typo", "shared_fs: /a\nckpt_root: /b\nrelease: x {instance_idd}\n", ["did you mean 'instance_id'"]),
    ("env a list", "shared_fs: /a\nckpt_root: /b\nenv: [a, b]\n", ["env", "non-empty string"]),
    ("a list", "- shared_fs\n", ["must be a mapping"]),
    ("empty", "", ["must be a mapping", "empty"]),
    ("invalid YAML", "shared_fs: /a\nckpt_root: [/b\n", ["invalid YAML", "line"]),
    ("duplicate key", "shared_fs: /a\nshared_fs: /b\nckpt_root: /c\n", ["line 2", "given twice"]),
]


@pytest.mark.parametrize(("case", "body", "needles"), BAD_PROFILES, ids=[c[0] for c in BAD_PROFILES])
def test_bad_repo_profile_is_refused_naming_its_file(local_project: LocalProject, case: str, body: str,
                                                     needles: list[str]) -> None:
    _profile(local_project, "mine", body)
    local_project.write_config(profile="mine", workdir="/srv/proj")
    refused(local_project, "profiles/mine.yaml", *needles)


def test_repo_profile_wins_over_the_shipped_one(local_project: LocalProject) -> None:
    _profile(local_project, "autodl", "shared_fs: /mnt/nfs\nckpt_root: /scratch/{host}\n")
    local_project.write_config(profile="autodl", workdir="/srv/proj")
    p = load_project(local_project.root)
    assert p.profile.shared_fs == "/mnt/nfs" and p.hosts["h1"].ckpt_root == "/scratch/h1"
    assert p.sweep_root() == "/mnt/nfs/ablate/t1"


def test_unknown_profile_lists_the_shipped_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_profile("nosuch", tmp_path, "ablate.yaml: profile")
    assert ei.value.exit_code == 2
    for name in ("autodl", "bare", "local", "runpod", "vast"):
        assert name in ei.value.message


def test_shipped_profiles_all_load_and_keep_their_facts(tmp_path: Path) -> None:
    assert set(shipped_profiles()) >= {"autodl", "runpod", "vast", "bare", "local"}
    got: dict[str, Profile] = {n: load_profile(n, tmp_path, "t") for n in shipped_profiles()}
    assert got["autodl"].shared_fs == "/root/autodl-fs" and got["autodl"].release is None
    assert got["autodl"].ckpt_root.startswith("/root/autodl-tmp")
    assert got["runpod"].shared_fs == "/workspace" and not got["runpod"].ckpt_root.startswith("/workspace")
    assert got["runpod"].release == "runpodctl pod stop {instance_id}"
    assert got["vast"].release == "vastai destroy instance {instance_id}"
    assert "/venv/main/bin/activate" in (got["vast"].env or "")
    assert got["local"].transport == "local"
    for name in ("autodl", "runpod", "vast", "bare"):
        assert got[name].transport == "ssh"
        assert got[name].shared_fs != got[name].ckpt_root
    texts = shipped_profiles()
    assert "region" in texts["autodl"].lower() and "pro" in texts["autodl"].lower()
    assert "tmux" in texts["runpod"] and "not installed" in texts["runpod"].lower()
    assert "doctor" in texts["vast"] and "no filesystem shared" in texts["vast"].lower()


# --------------------------------------------------------------------------- queue lines

def _parse(p: LocalProject, text: str | bytes, name: str = "q1") -> cells.QueueFile:
    path = p.root / "queues" / f"{name}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return cells.read_queue(load_project(p.root), name)


BAD_LINES: list[tuple[str, str, list[str]]] = [
    ("epochs zero", "c/a.yaml recon 0", ["epochs", "'0'"]),
    ("epochs negative", "c/a.yaml recon -3", ["epochs", "'-3'"]),
    ("epochs word", "c/a.yaml recon ten", ["epochs", "'ten'"]),
    ("epochs float", "c/a.yaml recon 2.5", ["epochs"]),
    ("epochs exponent", "c/a.yaml recon 1e3", ["epochs"]),
    ("too many fields", "c/a.yaml recon 3 extra", ["expected `<cfg_path> <task> [epochs] [priority=N]`"]),
    ("inline comment", "c/a.yaml recon 3 # note", ["expected `<cfg_path> <task> [epochs] [priority=N]`"]),
    ("too few fields", "c/a.yaml", ["expected `<cfg_path> <task> [epochs] [priority=N]`"]),
    ("unknown task", "c/a.yaml recn", ["task 'recn'", "did you mean 'recon'"]),
    ("name ..", ".. recon", ["cell name"]),
    ("name ends in ..", "c/.. recon", ["cell name"]),
    ("dot file", "c/.hidden.yaml recon", ["cell name '.hidden'"]),
    ("command substitution", "c/$(x).yaml recon", ["shell would interpret"]),
    ("backticks", "c/`id`.yaml recon", ["shell would interpret"]),
    ("semicolon", "c/a;b.yaml recon", ["shell would interpret"]),
    ("pipe", "c/a|b.yaml recon", ["shell would interpret"]),
    ("quote", "c/a'b.yaml recon", ["shell would interpret"]),
    ("glob char", "c/*.yaml recon", ["shell would interpret"]),
    ("space in name", "c/a b.yaml recon", ["'c/a b.yaml'", "space"]),
    ("spaces in name", "c/a b c.yaml det 4", ["'c/a b c.yaml'", "space"]),
    ("directory", "c/ recon", ["directory"]),
    ("name too long", "c/" + "a" * 130 + ".yaml recon", ["cell name"]),
]


@pytest.mark.parametrize(("case", "line", "needles"), BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_bad_queue_line_names_file_and_line(local_project: LocalProject, case: str, line: str,
                                            needles: list[str]) -> None:
    with pytest.raises(QueueError) as ei:
        _parse(local_project, f"# header\n\nc/ok.yaml recon\n{line}\n")
    assert ei.value.exit_code == 2
    assert "queues/q1.txt:4" in ei.value.message
    for needle in needles:
        assert needle in ei.value.message, (needle, ei.value.message)


def test_crlf_queue_is_normalised(local_project: LocalProject) -> None:
    qf = _parse(local_project, b"# c\r\nc/a.yaml recon 20\r\nc/b.yaml det\r\n\r\nc/c.yaml recon\r")
    assert [ln.cell.line for ln in qf.cells if ln.cell] == ["c/a.yaml recon 20", "c/b.yaml det 2",
                                                            "c/c.yaml recon 3"]
    assert all("\r" not in ln.text for ln in qf.lines)
    assert [ln.index for ln in qf.cells] == [1, 2, 4]  # blank and comment lines keep their index
    assert "\r" not in qf.normalized_text()


def test_bom_is_stripped(local_project: LocalProject) -> None:
    qf = _parse(local_project, "\ufeffc/a.yaml recon\n".encode())
    assert [ln.cell.cfg for ln in qf.cells if ln.cell] == ["c/a.yaml"]


def test_non_utf8_queue_file_is_refused(local_project: LocalProject) -> None:
    with pytest.raises(QueueError) as ei:
        _parse(local_project, b"c/caf\xe9.yaml recon\n")
    assert ei.value.exit_code == 2 and "q1.txt" in ei.value.message and "UTF-8" in ei.value.message


def test_nul_in_queue_file_is_refused(local_project: LocalProject) -> None:
    with pytest.raises(QueueError) as ei:
        _parse(local_project, b"c/a.yaml recon\x00\n")
    assert "q1.txt" in ei.value.message and "NUL" in ei.value.message


@pytest.mark.parametrize("name", ["a b", "$(x)", "a;b", ".hidden"])
def test_unsafe_queue_file_name_is_refused(local_project: LocalProject, name: str) -> None:
    (local_project.root / "queues").mkdir()
    (local_project.root / "queues" / f"{name}.txt").write_text("c/a.yaml recon\n")
    with pytest.raises(QueueError) as ei:
        cells.load_roster(load_project(local_project.root))
    assert ei.value.exit_code == 2 and "queue name" in ei.value.message


def test_missing_queue_lists_the_known_ones(local_project: LocalProject) -> None:
    local_project.queue("alpha", ["c/a.yaml recon"])
    with pytest.raises(QueueError) as ei:
        cells.read_queue(load_project(local_project.root), "beta")
    assert "alpha" in ei.value.message and "ablate plan" in ei.value.message


@pytest.mark.parametrize("header", ["# ablate: host=$(x)", "# ablate: slot=-1", "# ablate: slot=one"])
def test_bad_plan_header_is_refused(local_project: LocalProject, header: str) -> None:
    with pytest.raises(QueueError) as ei:
        _parse(local_project, f"{header}\nc/a.yaml recon\n")
    assert "queues/q1.txt:1" in ei.value.message and "header" in ei.value.message


def test_plan_header_is_read(local_project: LocalProject) -> None:
    qf = _parse(local_project, "# ablate: host=h2 slot=1\nc/a.yaml recon\n")
    assert (qf.host, qf.slot) == ("h2", 1)
    plain = _parse(local_project, "# ablate: my notes about this queue\nc/a.yaml recon\n", "q2")
    assert (plain.host, plain.slot) == (None, None)


def test_collision_between_two_queue_files_names_both_locations(local_project: LocalProject) -> None:
    local_project.queue("qa", ["# a", "c/x/model.yaml recon"])
    local_project.queue("qb", ["", "", "c/y/model.yaml recon"])
    with pytest.raises(QueueError) as ei:
        cells.load_roster(load_project(local_project.root))
    msg = ei.value.message
    assert ei.value.exit_code == 2
    assert "queues/qa.txt:2" in msg and "queues/qb.txt:3" in msg and "'model'" in msg
    assert "c/x/model.yaml" in msg and "c/y/model.yaml" in msg


def test_same_name_different_epochs_is_a_collision(local_project: LocalProject) -> None:
    local_project.queue("qa", ["c/a.yaml recon 3", "c/a.yaml recon 4"])
    with pytest.raises(QueueError) as ei:
        cells.load_roster(load_project(local_project.root))
    assert "queues/qa.txt:1" in ei.value.message and "queues/qa.txt:2" in ei.value.message


def test_identical_line_in_two_queues_is_one_cell(local_project: LocalProject) -> None:
    local_project.queue("qa", ["c/a.yaml recon", "c/b.yaml det"])
    local_project.queue("qb", ["c/a.yaml recon 3"])  # 3 is recon's default: the same cell
    roster = cells.load_roster(load_project(local_project.root))
    assert roster.names == ["a", "b"]
    assert roster.cells["a"] == cells.Cell("c/a.yaml", "recon", 3)


def test_roster_digest_tracks_identity(local_project: LocalProject) -> None:
    local_project.queue("qa", ["c/a.yaml recon"])
    d1 = cells.load_roster(load_project(local_project.root)).digest()
    local_project.queue("qa", ["# moved down", "c/a.yaml recon"])
    assert cells.load_roster(load_project(local_project.root)).digest() == d1
    local_project.queue("qa", ["c/a.yaml recon 4"])
    assert cells.load_roster(load_project(local_project.root)).digest() != d1


def test_cell_name_and_cat() -> None:
    c = cells.Cell("configs/ablation/recon/no_aug.v2.yaml", "recon", 3)
    assert c.name == "no_aug.v2" and c.cat == "recon"
    assert cells.Cell("top.yaml", "recon", 3).cat == "default"
    assert cells.cell_name("noext") == "noext"


def test_repo_example_queue_parses() -> None:
    tasks = {"reconstruction": _task("reconstruction", 20), "detection": _task("detection", 50)}
    text = (REPO / "queues" / "example.txt").read_text()
    qf = cells.parse_queue_text("example", text, tasks, REPO / "queues" / "example.txt")
    assert len(qf.cells) >= 2 and qf.host is None
    assert sum(ln.text.startswith("#") for ln in qf.lines) >= 5


def _task(name: str, epochs: int) -> Any:
    from ablate.config.project import Task

    return Task(name, epochs, 1.0)
