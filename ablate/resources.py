"""The one way to read files shipped inside the package: the wrappers (`ablate.wrappers`, from the
top-level `wrappers/`), the profiles (`ablate.profiles`, from `profiles/`), the report's assets and
the host-side modules of `ablate.remote`. setup.cfg maps `wrappers/` and `profiles/` into the package,
so ablate must be installed (`pip install .` or `-e .`) for them to be found; there is no second
path for an uninstalled checkout."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence
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


def module(name: str) -> bytes:
    """The source of the installed module `name` (dotted: "ablate.remote.queue.runner")."""
    package, _, leaf = name.rpartition(".")
    return read(package, f"{leaf}.py")


def module_files(modules: Sequence[str]) -> dict[str, bytes]:
    """Path -> source of the named modules (dotted), each under its package's path, with an empty
    `__init__.py` for every package on the way: what runs them anywhere with only the stdlib."""
    files: dict[str, bytes] = {}
    for name in modules:
        parts = name.split(".")
        for i in range(1, len(parts)):
            files.setdefault("/".join(parts[:i]) + "/__init__.py", b"")
    for name in modules:
        files["/".join(name.split(".")) + ".py"] = module(name)
    return dict(sorted(files.items()))


# Before `main`: the archive's modules come from code compiled once per host and interpreter
# (ablate/remote/codecache.py), not from their source at every start.
CACHED_MAIN = b"import sys\n\nfrom ablate.remote.codecache import install\n\ninstall(sys.path[0])\n"


def zipapp_modules(modules: Sequence[str]) -> list[str]:
    """The modules a zipapp of `modules` holds: those, and the code cache its main installs."""
    return sorted({*modules, "ablate.remote.codecache"})


def zipapp(main: bytes, modules: Sequence[str], *, deflate: bool) -> bytes:
    """A zipapp of `__main__.py` (`main`, after `CACHED_MAIN`) and the named modules (dotted) under
    their package paths (`zipapp_modules`), so `python3 X.pyz` runs the very code the
    controller imports; byte-for-byte the same for the same sources (fixed dates and modes;
    `deflate=False` stores them, independent of zlib's version too): its content names it."""
    how = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    files = {"__main__.py": CACHED_MAIN + main, **module_files(zipapp_modules(modules))}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", how) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = how
            info.external_attr = 0o444 << 16
            z.writestr(info, data)
    return buf.getvalue()
