"""A zipapp's modules compiled once per host and interpreter (ablate/remote/codecache.py): the runner's
zipapp loads its modules from the kept code objects, a new source or a torn file is compiled again,
and without a home to keep them in (or one that cannot be written) the modules load as before."""

from __future__ import annotations

import binascii
import marshal
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from ablate.remote import codecache
from ablate.run.placement import packaged_runner

PROGRAM = ("import sys; from ablate.remote.codecache import install; install(sys.argv[1]); "
           "import pkg.mod as m; print(m.VALUE, m.HELPER, m.__file__, m.__package__)")


def archive(path: Path, value: str) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/helper.py", "NAME = 'helper'\n")
        z.writestr("pkg/mod.py", f"from .helper import NAME as HELPER\nVALUE = {value!r}\n")
    return path


def run(zip_path: Path, home: Path | None, *opts: str) -> list[str]:
    drop = ("HOME", "XDG_CACHE_HOME", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run([sys.executable, *opts, "-c", PROGRAM, str(zip_path)], env=env, capture_output=True,
                          text=True, check=True).stdout.split()


def kept(home: Path) -> dict[str, Path]:
    """Module name -> its kept file."""
    return {p.name.rsplit(".", 2)[0]: p for p in home.glob(".cache/ablate/code/*/pkg*.bin")}


def test_modules_load_from_code_kept_once_per_source(tmp_path: Path) -> None:
    home = tmp_path / "home"
    one = archive(tmp_path / "one.pyz", "first")
    assert run(one, home) == ["first", "helper", f"{one}/pkg/mod.py", "pkg"]
    files = kept(home)
    assert set(files) == {"pkg", "pkg.mod", "pkg.helper"}, files
    assert files["pkg.mod"].parent.stat().st_mode & 0o077 == 0  # the interpreter's dir: the user's alone

    # the kept code is what runs: one whose header and crc are right is taken as it is
    head = codecache.header()
    code = marshal.dumps(compile("from .helper import NAME as HELPER\nVALUE = 'kept'\n", "x", "exec"))
    files["pkg.mod"].write_bytes(head + b"%08x" % binascii.crc32(code) + code)
    assert run(one, home)[0] == "kept"

    # a torn file fails its check: compiled again, and written whole again
    files["pkg.mod"].write_bytes(files["pkg.mod"].read_bytes()[:-7])
    assert run(one, home)[0] == "first"
    assert run(one, home)[0] == "first" and files["pkg.mod"].stat().st_size > len(head) + 8

    # a new source has a hash of its own: never the old code
    two = archive(tmp_path / "two.pyz", "second")
    assert run(two, home)[0] == "second"
    assert len(list(home.glob(".cache/ablate/code/*/pkg.mod.*.bin"))) == 2


def test_without_a_home_or_a_writable_cache_modules_load_as_before(tmp_path: Path) -> None:
    one = archive(tmp_path / "one.pyz", "first")
    assert run(one, None)[0] == "first"
    assert run(one, tmp_path / "b", "-B")[0] == "first" and not (tmp_path / "b").exists()  # as Python's .pyc
    home = tmp_path / "ro"
    (home / ".cache").mkdir(parents=True)
    (home / ".cache" / "ablate").write_text("a file where the cache dir would be")
    assert run(one, home)[0] == "first"
    assert codecache.cache_dir({}) is None
    assert codecache.cache_dir({"HOME": "/h"}) == f"/h/.cache/ablate/code/{sys.implementation.cache_tag}"
    assert str(codecache.cache_dir({"HOME": "/h", "XDG_CACHE_HOME": "/x"})).startswith("/x/ablate/code/")


def test_the_runner_zipapp_keeps_its_modules_compiled(tmp_path: Path) -> None:
    pyz = tmp_path / "runner.pyz"
    pyz.write_bytes(packaged_runner())
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    env.pop("XDG_CACHE_HOME", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for _ in range(2):  # the second start loads what the first kept
        r = subprocess.run([sys.executable, "-S", str(pyz), "line", "--help"], env=env, capture_output=True,
                           text=True)
        assert r.returncode == 0 and "--from" in r.stdout, r.stderr
    names = {p.name.rsplit(".", 2)[0] for p in (tmp_path / "home").glob(".cache/ablate/code/*/*.bin")}
    assert {"ablate.remote.queue.serve", "ablate.remote.queue.runner", "ablate.remote.codecache"} - names == {
        "ablate.remote.codecache"}, names  # the cache's own module is loaded before it is installed


def test_a_traceback_from_a_kept_module_shows_its_source_line(tmp_path: Path) -> None:
    """As zipimport's modules do, to the `traceback` module (the runner's serve logs with it)."""
    pyz = tmp_path / "bad.pyz"
    with zipfile.ZipFile(pyz, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/bad.py", "def f():\n    raise ValueError('the line shown')\n")
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    env.pop("XDG_CACHE_HOME", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    code = ("import sys, traceback\nfrom ablate.remote.codecache import install\ninstall(sys.argv[1])\n"
            "import pkg.bad\ntry:\n    pkg.bad.f()\n"
            "except ValueError:\n    traceback.print_exc()\n    sys.exit(1)\n")
    for _ in range(2):  # compiled, then kept
        r = subprocess.run([sys.executable, "-c", code, str(pyz)], env=env, capture_output=True, text=True)
        assert r.returncode == 1 and "raise ValueError('the line shown')" in r.stderr, r.stderr
