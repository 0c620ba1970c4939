"""What ablate ships to a host is exactly what runs there: each artefact (the runner's zipapp, the
probe's library, the Slurm adapter's zipapp, a storage host's boot program, the host agent) carries
the ablate modules its entry imports at any depth, no more and no fewer, and each runs alone in an
isolated interpreter with the standard library only."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ablate import resources
from ablate.remote.host.probe import ENTRY as PROBE_ENTRY
from ablate.run import placement, store_launch
from ablate.transport import slurm as slurm_transport
from ablate.transport import sshfs
from tests.helpers.imports import REPO, closure, module_path

# Each artefact: (the modules it ships, the source of its entry)
ARTEFACTS = {
    "runner": (placement.RUNNER_MODULES, placement._RUNNER_MAIN.decode()),
    "probe": (sshfs.PROBE_MODULES, PROBE_ENTRY),
    "slurm adapter": (slurm_transport.DECISIONS, slurm_transport._MAIN.decode()),
    "storage boot": (store_launch._SHIPPED, "import ablate.remote.store.instance_boot"),
    "host agent": (("ablate.remote.host.agent",), "import ablate.remote.host.agent"),
}
# Imports that only a storage host's runner makes, when it opens its store: never at import.
LAZY_THIRD_PARTY = ("boto3", "botocore")


@pytest.mark.parametrize("name", sorted(ARTEFACTS))
def test_each_artefact_ships_exactly_what_its_entry_imports(name: str) -> None:
    shipped, entry = ARTEFACTS[name]
    assert sorted(shipped) == sorted(closure([entry])), f"{name}: ship exactly these"


def test_the_probe_library_is_its_modules_under_their_package_paths() -> None:
    lib = sshfs.probe_lib()
    assert {p for p in lib if not p.endswith("__init__.py")} == {
        m.replace(".", "/") + ".py" for m in sshfs.PROBE_MODULES}
    assert "ablate/remote/host/probe.py" in lib and not any("queue" in p or "store" in p for p in lib)


def test_every_package_on_a_shipped_path_holds_only_its_docstring() -> None:
    """The artefacts carry empty `__init__.py` files: a package that ran code at import would run
    differently on the host than here."""
    packages = {m.rsplit(".", i)[0] for shipped, _ in ARTEFACTS.values() for m in shipped
                for i in range(1, m.count(".") + 1)}
    for package in sorted(packages):
        path = module_path(package)
        assert path is not None and path.name == "__init__.py", package
        names = set(compile(path.read_text(), str(path), "exec").co_names)
        allowed = {"__doc__", "__version__"} if package == "ablate" else {"__doc__"}  # a constant
        assert names <= allowed, f"{path}: code in a shipped package's __init__: {names - allowed}"


def _isolated(tmp_path: Path, files: dict[str, bytes], code: str) -> subprocess.CompletedProcess[str]:
    """`code` in `python -I -S` with only `files` on its path and third-party imports refused."""
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    guard = ("import sys\n"
             "class Refuse:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             f"        if name.split('.')[0] in {LAZY_THIRD_PARTY!r}:\n"
             "            raise ImportError('not shipped: ' + name)\n"
             "sys.meta_path.insert(0, Refuse())\n"
             f"sys.path[:] = [{str(tmp_path)!r}] + [p for p in sys.path if 'site-packages' not in p]\n")
    return subprocess.run([sys.executable, "-I", "-S", "-c", guard + code], capture_output=True, text=True,
                          check=False, timeout=60)


@pytest.mark.parametrize("name", sorted(ARTEFACTS))
def test_each_artefact_imports_alone_with_the_standard_library_only(tmp_path: Path, name: str) -> None:
    shipped, _ = ARTEFACTS[name]
    code = "".join(f"import {m}\nassert {m}.__file__.startswith(sys.path[0]), {m}.__file__\n"
                   for m in shipped)
    p = _isolated(tmp_path, resources.module_files(shipped), code + "print('ok')\n")
    assert p.returncode == 0 and p.stdout == "ok\n", p.stderr


def test_the_probe_answers_from_its_library_alone(tmp_path: Path) -> None:
    """As a host runs it: its entry, an op and its JSON; here a write through `apply`, then `now`."""
    fs = tmp_path / "fs"
    fs.mkdir()
    ops = json.dumps({"root": str(fs), "ops": [{"op": "append_line", "path": str(fs / "l"), "line": "x"}]})
    for op, arg in (("apply", ops), ("now", json.dumps({"root": str(fs)}))):
        code = f"sys.argv[1:] = [{op!r}, {arg!r}]\n{PROBE_ENTRY}\n"
        p = _isolated(tmp_path / "lib", sshfs.probe_lib(), code)
        assert p.returncode == 0 and json.loads(p.stdout), p.stderr
    assert (fs / "l").read_text() == "x\n"


def test_the_runner_zipapp_runs_a_decision_alone(tmp_path: Path) -> None:
    pyz = tmp_path / "runner.pyz"
    pyz.write_bytes(placement.packaged_runner())
    with zipfile.ZipFile(io.BytesIO(pyz.read_bytes())) as z:
        assert {n for n in z.namelist() if not n.endswith("__init__.py")} == {
            "__main__.py",
            *(m.replace(".", "/") + ".py" for m in resources.zipapp_modules(placement.RUNNER_MODULES))}
    p = subprocess.run([sys.executable, "-I", "-S", str(pyz), "attempt"], capture_output=True, text=True,
                       check=False, timeout=60)
    assert "Traceback" not in p.stderr and "ModuleNotFoundError" not in p.stderr, p.stderr


def test_setup_cfg_installs_every_package() -> None:
    """A package missing from setup.cfg's list is missing from every non-editable install."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    packages = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "ablate").rglob("__init__.py")
                if "__pycache__" not in p.parts}
    assert packages <= listed, f"add to setup.cfg's packages: {sorted(packages - listed)}"
