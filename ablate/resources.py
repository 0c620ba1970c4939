"""The one way to read files shipped inside the package: the wrappers (`ablate.wrappers`, from the
top-level `wrappers/`), the profiles (`ablate.profiles`, from `profiles/`), the report's assets and
the host-side package `ablate.remote`. setup.cfg maps `wrappers/` and `profiles/` into the package,
so ablate must be installed (`pip install .` or `-e .`) for them to be found; there is no second
path for an uninstalled checkout."""

from __future__ import annotations

from importlib import resources

from ablate.errors import AblateError


def read(package: str, name: str) -> bytes:
    """The bytes of file `name` of the installed package `package` (e.g. "ablate.wrappers")."""
    try:
        return (resources.files(package) / name).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise AblateError(f"{package}/{name} is not installed with ablate ({e}); "
                          "reinstall it: pip install .") from e


def listing(package: str, suffix: str) -> dict[str, bytes]:
    """name -> bytes of every file of `package` whose name ends with `suffix`, sorted by name."""
    try:
        entries = sorted(resources.files(package).iterdir(), key=lambda e: e.name)
    except ModuleNotFoundError as e:
        raise AblateError(f"package data {package} is not installed with ablate ({e}); "
                          "reinstall it: pip install .") from e
    return {e.name: e.read_bytes() for e in entries if e.name.endswith(suffix) and e.is_file()}
