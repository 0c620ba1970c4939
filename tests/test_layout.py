"""The tests' own layout: test modules share code only through tests/helpers/ and fixtures through
conftest.py, never by importing each other or conftest; the CLI runs in-process only through the
`cli` fixture (one exit-code convention); conftest.py holds fixtures only."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Modules nobody may import: other test modules and conftest (pytest loads it; fixtures reach
# tests by name). Bare names too, as they would resolve with tests/ on sys.path.
FORBIDDEN = re.compile(r"(tests\.)?(conftest|test_\w+)")
# Beside the tests and conftest, only the helpers package, and the test bed: scripts/bench_*.py
# import it as `tests.testbed`.
ALLOWED_AT_TOP = {"__init__.py", "conftest.py", "testbed.py"}


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def imported(path: Path, root: Path = TESTS.parent) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every module `path` (under `root`) may import, at any depth:
    `import M` gives M, `from M import n` gives M and M.n (n may be a submodule); relative
    imports resolved."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(TESTS.parent)}:{line}"


def test_no_module_under_tests_imports_a_test_module_or_conftest() -> None:
    bad = sorted({f"{where(path, line)} imports {name}" for path in python_files()
                  for line, name in imported(path) if FORBIDDEN.fullmatch(name)})
    assert bad == [], "shared code goes into tests/helpers/, fixtures into conftest.py:\n" + "\n".join(bad)


def test_the_cli_runs_in_process_only_through_the_cli_fixture() -> None:
    runner = TESTS / "helpers" / "cli.py"
    bad = [f"{where(path, line)} imports {name}" for path in python_files() if path != runner
           for line, name in imported(path) if name == "ablate.cli.main"]
    assert bad == [], "run ablate in-process with the `cli` fixture (helpers/cli.py):\n" + "\n".join(bad)


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "fixture"


def test_conftest_holds_fixtures_only() -> None:
    tree = ast.parse((TESTS / "conftest.py").read_text())
    bad = [f"{node.name} (line {node.lineno})" for node in tree.body
           if isinstance(node, ast.ClassDef)
           or (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
               and not node.name.startswith("pytest_")
               and not any(_is_fixture(d) for d in node.decorator_list))]
    assert bad == [], "helpers go into tests/helpers/: " + ", ".join(bad)


def test_shared_code_lives_in_the_helpers_package() -> None:
    assert (TESTS / "helpers" / "__init__.py").is_file()
    stray = [p.name for p in TESTS.glob("*.py")
             if p.name not in ALLOWED_AT_TOP and not p.name.startswith("test_")]
    assert stray == [], f"move these into tests/helpers/: {stray}"


@pytest.mark.parametrize(("source", "names"), [
    ("from tests.test_watch import Pane", {"tests.test_watch", "tests.test_watch.Pane"}),
    ("from tests import conftest", {"tests", "tests.conftest"}),
    ("from . import test_lock", {"tests", "tests.test_lock"}),
    ("from .conftest import wait_for", {"tests.conftest", "tests.conftest.wait_for"}),
    ("import tests.test_cli as t", {"tests.test_cli"}),
    ("def f():\n    from tests.conftest import TRAIN", {"tests.conftest", "tests.conftest.TRAIN"}),
])
def test_the_import_scan_sees_every_form(tmp_path: Path, source: str, names: set[str]) -> None:
    """A layout check that could not see an import would pass with the rule broken."""
    module = tmp_path / "tests" / "test_x.py"
    module.parent.mkdir()
    module.write_text(source + "\n")
    got = {name for _, name in imported(module, tmp_path)}
    assert got == names
    assert any(FORBIDDEN.fullmatch(n) for n in got)
