"""What deploy places, built from the package: each wrapper one file with the shared bash inlined,
the runner zipapp byte-for-byte the modules the controller imports."""

from __future__ import annotations

import io
import subprocess
import zipfile
from pathlib import Path

from ablate import resources
from ablate.run.placement import RUNNER_MODULES, packaged_runner, packaged_wrappers

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
    assert sorted(z.namelist()) == sorted(["__main__.py", "ablate/__init__.py", "ablate/remote/__init__.py",
                                           *(f"ablate/remote/{m}" for m in RUNNER_MODULES)])
    for m in RUNNER_MODULES:
        assert z.read(f"ablate/remote/{m}") == resources.read("ablate.remote", m)
