"""`autostop:` in ablate.yaml and in profiles (docs/configuration.md, "Stopping idle instances"): off
unless set; ablate.yaml's reaches every host, a profile's wins for its hosts, a Slurm host has none
and a Slurm profile may not set one; every bad value is refused with exit 2 and one line naming the
file and the key; each shipped profile still loads, and its commented-out example loads once
uncommented."""

# The case table below keeps one case per line, which reads better than wrapping it.
# ruff: noqa: E501

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import Project, load_profile, load_project, shipped_profiles
from ablate.config.settings import Autostop
from ablate.errors import ConfigError
from tests.helpers.project import LocalProject, refused, yaml_text

RUNPOD = "runpodctl stop pod $RUNPOD_POD_ID"
ON = {"idle": "10m", "command": RUNPOD}


def load(p: LocalProject, **overrides: object) -> Project:
    p.write_config(**overrides)
    return load_project(p.root)


def _profile(p: LocalProject, name: str, **keys: Any) -> None:
    """A repo profile on this machine, its sweep where the shipped `local` keeps it."""
    body = {"transport": "local", "shared_fs": ".ablate/shared", "ckpt_root": ".ablate/local/{host}/ckpt", **keys}
    (p.root / "profiles").mkdir(exist_ok=True)
    (p.root / "profiles" / f"{name}.yaml").write_text(yaml_text(body, sort_keys=False))


# --------------------------------------------------------------------------- what each host gets


@pytest.mark.parametrize("value", ["absent", False, None])
def test_autostop_is_off_unless_set(local_project: LocalProject, value: object) -> None:
    project = load(local_project) if value == "absent" else load(local_project, autostop=value)
    assert project.autostop is None
    assert [h.autostop for h in project.hosts.values()] == [None, None]


def test_the_projects_autostop_reaches_every_host(local_project: LocalProject) -> None:
    project = load(local_project, autostop=ON)
    assert project.autostop == Autostop(600.0, RUNPOD, 1)
    assert {n: h.autostop for n, h in project.hosts.items()} == {"h1": project.autostop, "h2": project.autostop}


def test_a_profiles_autostop_wins_for_its_hosts_only(local_project: LocalProject) -> None:
    _profile(local_project, "mine", autostop={"idle": 30, "command": "shutdown", "keep": 0})
    _profile(local_project, "plain")
    _profile(local_project, "off", autostop=False)
    project = load(local_project, autostop=ON, hosts={
        "h1": {}, "h2": {"profile": "mine"}, "h3": {"profile": "plain"}, "h4": {"profile": "off"}})
    hosts = project.hosts
    assert hosts["h2"].profile.autostop == hosts["h2"].autostop == Autostop(30.0, "shutdown", 0)
    assert hosts["h1"].autostop == hosts["h3"].autostop == Autostop(600.0, RUNPOD, 1)
    # a profile's `false` turns it off for its hosts (lab servers that are never to be stopped)
    assert hosts["h4"].profile.autostop is None and hosts["h4"].autostop is None


def test_a_profiles_autostop_applies_without_one_in_ablate_yaml(local_project: LocalProject) -> None:
    _profile(local_project, "mine", autostop={"idle": "20s", "command": "shutdown"})
    project = load(local_project, hosts={"h1": {}, "h2": {"profile": "mine"}})
    assert project.autostop is None and project.hosts["h1"].autostop is None
    assert project.hosts["h2"].autostop == Autostop(20.0, "shutdown", 1)


@pytest.mark.parametrize(("idle", "seconds"), [("20s", 20.0), ("10m", 600.0), ("1.5h", 5400.0), (45, 45.0), (0, 0.0), ("0s", 0.0)])
def test_idle_is_a_duration(local_project: LocalProject, idle: object, seconds: float) -> None:
    got = load(local_project, autostop={"idle": idle, "command": "shutdown"}).autostop
    assert got is not None and got.idle == seconds


@pytest.mark.parametrize(("keep", "expected"), [(None, 1), (0, 0), (3, 3)])
def test_keep_is_a_whole_number_defaulting_to_one(local_project: LocalProject, keep: object,
                                                  expected: int) -> None:
    spec = {**ON, **({} if keep is None else {"keep": keep})}
    got = load(local_project, autostop=spec).autostop
    assert got is not None and got.keep == expected


def test_the_command_is_kept_for_the_instances_shell(local_project: LocalProject) -> None:
    """sh -c runs it there: variables, substitutions and several lines are the shell's to expand."""
    command = 'sync\nvastai stop instance "$CONTAINER_ID" --api-key "$(cat /run/key)"'
    got = load(local_project, autostop={"idle": "1m", "command": command}).autostop
    assert got is not None and got.command == command


# --------------------------------------------------------------------------- refused


BAD: list[tuple[str, object, list[str]]] = [
    ("idle a word", {"idle": "soon", "command": RUNPOD}, ["ablate.yaml: autostop.idle", "a duration like 30m"]),
    ("idle negative", {"idle": -5, "command": RUNPOD}, ["autostop.idle", "non-negative number of seconds"]),
    ("idle negative text", {"idle": "-5m", "command": RUNPOD}, ["autostop.idle", "a duration like"]),
    ("idle a bool", {"idle": True, "command": RUNPOD}, ["autostop.idle", "a duration"]),
    ("idle infinite", {"idle": float("inf"), "command": RUNPOD}, ["autostop.idle", "number of seconds"]),
    ("no idle", {"command": RUNPOD}, ["ablate.yaml: autostop.idle: is required", "idle: 10m"]),
    ("no command", {"idle": "10m"}, ["ablate.yaml: autostop.command: is required", "runpodctl stop pod"]),
    ("command null", {"idle": "10m", "command": None}, ["autostop.command: is required"]),
    ("command empty", {"idle": "10m", "command": "  "}, ["autostop.command", "non-empty string"]),
    ("command a list", {"idle": "10m", "command": ["shutdown"]}, ["autostop.command", "non-empty string"]),
    ("command with NUL", {"idle": "10m", "command": "shut\x00down"}, ["autostop.command", "NUL"]),
    ("keep negative", {**ON, "keep": -1}, ["ablate.yaml: autostop.keep", "whole number >= 0", "-1"]),
    ("keep a float", {**ON, "keep": 1.5}, ["autostop.keep", "whole number"]),
    ("keep a bool", {**ON, "keep": True}, ["autostop.keep", "whole number"]),
    ("keep a word", {**ON, "keep": "one"}, ["autostop.keep", "whole number"]),
    ("unknown key", {**ON, "idel": "5m"}, ["ablate.yaml: unknown key autostop.idel", "did you mean 'idle'", "allowed: command, idle, keep"]),
    ("command typo", {"idle": "10m", "comand": RUNPOD}, ["unknown key autostop.comand", "did you mean 'command'"]),
    ("true", True, ["ablate.yaml: autostop", "must be a mapping", "or false (off)"]),
    ("a command alone", RUNPOD, ["autostop", "must be a mapping with idle and command"]),
    ("a list", [ON], ["autostop", "must be a mapping"]),
]


@pytest.mark.parametrize(("case", "value", "needles"), BAD, ids=[c[0] for c in BAD])
def test_a_bad_autostop_is_refused_naming_the_key(local_project: LocalProject, case: str, value: object,
                                                  needles: list[str]) -> None:
    local_project.write_config(autostop=value)
    refused(local_project, *needles)


def test_a_top_level_typo_suggests_autostop(local_project: LocalProject) -> None:
    local_project.write_config(autostp=ON)
    refused(local_project, "ablate.yaml: unknown key autostp", "did you mean 'autostop'")


def test_a_bad_autostop_in_a_profile_names_the_profiles_file(local_project: LocalProject) -> None:
    _profile(local_project, "mine", autostop={"idle": "10m", "command": "shutdown", "keep": -2})
    local_project.write_config(hosts={"h1": {"profile": "mine"}})
    refused(local_project, "profiles/mine.yaml: autostop.keep", "whole number >= 0")


# --------------------------------------------------------------------------- Slurm


def _slurm(p: LocalProject, **keys: Any) -> None:
    body = {"transport": "slurm", "shared_fs": str(p.root / "shared"), "ckpt_root": str(p.root / "scratch"),
            "python": sys.executable, "slurm": {"time": "4:00:00", "grace": 60}, **keys}
    (p.root / "profiles").mkdir(exist_ok=True)
    (p.root / "profiles" / "cluster.yaml").write_text(yaml_text(body, sort_keys=False))


def test_a_slurm_profile_that_sets_autostop_is_refused(local_project: LocalProject) -> None:
    _slurm(local_project, autostop=ON)
    with pytest.raises(ConfigError) as ei:
        load_profile("cluster", local_project.root, "t")
    assert ei.value.exit_code == 2 and "\n" not in ei.value.message
    assert ei.value.message == (
        f"{local_project.root / 'profiles' / 'cluster.yaml'}: autostop: a Slurm host's job ends when its "
        "queue drains, nothing idles to stop; remove autostop from this profile")


def test_a_slurm_host_has_no_autostop_even_when_ablate_yaml_sets_one(local_project: LocalProject) -> None:
    _slurm(local_project, autostop=False)  # saying off is not setting it
    project = load(local_project, profile="cluster", workdir=str(local_project.root), autostop=ON,
                   hosts={"cluster": {"queues": 2}})
    assert project.autostop == Autostop(600.0, RUNPOD, 1)
    assert project.hosts["cluster"].autostop is None


# --------------------------------------------------------------------------- the shipped profiles

EXAMPLE = re.compile(r"^# (autostop: .*)$", re.MULTILINE)
# RunPod's reads PID 1's environment when the SSH session lacks the pod's variables
RUNPOD_SHIPPED = "runpodctl stop pod ${RUNPOD_POD_ID:-$(tr '\\0' '\\n' </proc/1/environ | sed -n 's/^RUNPOD_POD_ID=//p')}"
COMMANDS = {"autodl": "shutdown", "runpod": RUNPOD_SHIPPED, "vast": "vastai stop instance $CONTAINER_ID",
            "bare": "sudo shutdown -h now"}


def test_the_shipped_profiles_load_with_autostop_off(tmp_path: Path) -> None:
    for name in shipped_profiles():
        assert load_profile(name, tmp_path, "t").autostop is None, name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_shipped_profiles_commented_example_loads_uncommented(tmp_path: Path, name: str) -> None:
    text = shipped_profiles()[name]
    examples = EXAMPLE.findall(text)
    assert len(examples) == 1, examples
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / f"{name}.yaml").write_text(EXAMPLE.sub(r"\1", text))
    got = load_profile(name, tmp_path, "t")
    assert got.source.endswith(f"profiles/{name}.yaml")
    assert got.autostop is not None and got.autostop.command == COMMANDS[name] and got.autostop.idle > 0


def test_slurm_and_local_ship_no_autostop_example() -> None:
    texts = shipped_profiles()
    assert not EXAMPLE.search(texts["slurm"]) and not EXAMPLE.search(texts["local"])
