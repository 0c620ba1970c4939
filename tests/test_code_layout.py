"""The tests' own layout: test modules share code only through tests/helpers/ and fixtures through
conftest.py, never by importing each other or conftest; the CLI runs in-process only through the
`cli` fixture (one exit-code convention); conftest.py holds fixtures only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.imports import imported, imported_by, module_path

TESTS = Path(__file__).resolve().parent
# Modules nobody may import: other test modules and conftest (pytest loads it; fixtures reach
# tests by name). Bare names too, as they would resolve with tests/ on sys.path.
FORBIDDEN = re.compile(r"(tests\.)?(conftest|test_\w+)")
# Beside the tests and conftest, only the helpers package, and the test beds: scripts/bench_*.py
# import the SSH one as `tests.testbed`; the Slurm one (`tests.slurmbed`) sits beside it.
ALLOWED_AT_TOP = {"__init__.py", "conftest.py", "testbed.py", "testbed_storage.py", "slurmbed.py"}

# The scans below parse every module under tests/ and ablate/ (a second of CPU each time): in one
# xdist worker, each file is parsed once (tests/helpers/imports.py keeps a parse per process), not
# once in every worker that runs one of them.
pytestmark = pytest.mark.xdist_group("layout")


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


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


# --------------------------------------------------------------------------- the package's layout

PACKAGE = TESTS.parent / "ablate"
# Layers from the bottom: a module may import its own layer or any below it, never one above. The
# commands' parts too: planning, then running and watching, then results, then the report.
LAYERS = {"errors": 0, "resources": 0, "util": 0, "remote": 1, "config": 1, "transport": 2, "sweep": 3,
          "plan": 4, "run": 5, "monitor": 5, "doctor": 6, "results": 6, "report": 7, "demo": 8, "cli": 8,
          "cmdserver": 9, "__main__": 9}


def _ablate_modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts == ["ablate"]:
        return 0  # the package's __init__: its version only
    return LAYERS.get(parts[1]) if len(parts) > 1 and parts[0] == "ablate" else None


def test_ablate_imports_run_one_way() -> None:
    """Commands on top, the shared-FS model and transports below, leaf helpers at the bottom."""
    wrong = []
    for name, path in _ablate_modules().items():
        mine = _layer(name)
        assert mine is not None, f"{name}: a top-level part of ablate with no layer in LAYERS"
        for line, dep in imported(path, PACKAGE.parent):
            theirs = _layer(dep) if dep.startswith("ablate.") else None
            if theirs is not None and theirs > mine:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {dep}")
    assert not wrong, "\n".join(wrong)


def test_ablate_has_no_import_cycles() -> None:
    """Not even through a function-local or type-only import."""
    modules = _ablate_modules()
    graph = {name: sorted({dep for _, dep in imported(path, PACKAGE.parent) if dep in modules} - {name})
             for name, path in modules.items()}
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in graph[node]:
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep):], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_no_module_is_over_about_500_lines() -> None:
    long = {str(p.relative_to(PACKAGE.parent)): n for p in _ablate_modules().values()
            if (n := len(p.read_text().splitlines())) > 530}
    assert not long, f"split these: {long}"


# The wrappers keep the processes' life; what they decide is the runner's Python (issue 42: the Slurm
# adapter and run_queue's stop path had regrown 500 lines of decisions in bash). A wrapper past its
# size here is a decision that belongs in ablate/remote/, with a millisecond test.
WRAPPER_LINES = {"run_queue.sh": 700, "slurm_sessions.sh": 250, "run_one.sh": 250, "services.sh": 250,
                 "common.sh": 120}


def test_the_wrappers_stay_within_their_sizes() -> None:
    wrappers = PACKAGE.parent / "wrappers"
    sizes = {p.name: len(p.read_text().splitlines()) for p in wrappers.glob("*.sh")}
    assert set(sizes) == set(WRAPPER_LINES), "a new wrapper file: give it a size here"
    over = {name: n for name, n in sizes.items() if n > WRAPPER_LINES[name]}
    assert not over, f"move their decisions into the runner's Python: {over}"


# --------------------------------------------------------------------------- commands

CLI = PACKAGE / "cli.py"
# What cli.py's command functions import that is not the command's own module: status starts each
# host's `ssh -G` (ablate.transport.resolve_ahead) before it imports its own.
# Imported by a command function for what it starts ahead, not a command of its own.
NOT_COMMANDS = {"ablate.transport", "ablate.monitor.ahead"}
# They run commands one after another, as a user would: the CLI itself, and `ablate demo`'s flow.
DRIVERS = {"ablate.cli", "ablate.demo.run"}


def _is_command(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
        for d in node.decorator_list)


def command_modules() -> set[str]:
    """The module each `ablate` command calls into: per import in a command function of cli.py,
    the deepest ablate module it names (`from ablate.run import launch` names ablate.run.launch,
    `from ablate.report import report` the package ablate.report)."""
    modules = _ablate_modules()
    spans = [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(ast.parse(CLI.read_text()))
             if _is_command(n)]
    per_line: dict[int, list[str]] = {}
    for line, dep in imported(CLI, PACKAGE.parent):
        if dep in modules and any(a <= line <= b for a, b in spans):
            per_line.setdefault(line, []).append(dep)
    return {max(deps, key=len) for deps in per_line.values()} - NOT_COMMANDS


def test_the_command_scan_finds_every_command_module() -> None:
    """A scan that missed commands would let the rule below pass with commands importing commands."""
    found = command_modules()
    assert {"ablate.run.launch", "ablate.run.deploy", "ablate.doctor.command", "ablate.run.append",
            "ablate.monitor.status", "ablate.results.remediate", "ablate.results.pull",
            "ablate.results.reconcile", "ablate.report", "ablate.plan.planner", "ablate.demo.run"} <= found
    assert not found & {"ablate.run", "ablate.transport", "ablate.report.data"}


def test_no_command_module_imports_another() -> None:
    """What two commands share lives in a module of its own (refusals, placement, the launch
    pipeline and context, results.common), so one command never drags in another's world."""
    commands = command_modules()
    modules = _ablate_modules()
    wrong = [f"{modules[name].relative_to(PACKAGE.parent)}:{line} imports {dep}"
             for name in sorted(commands - DRIVERS)
             for line, dep in imported(modules[name], PACKAGE.parent) if dep in commands and dep != name]
    assert not wrong, "move what they share into a module no command owns:\n" + "\n".join(wrong)


# Every xdist worker collects every test module: one that imports a framework when it is imported
# costs each worker its import (torch, transformers and lightning: 7 s of CPU), test run or not.
FRAMEWORKS = {"torch", "transformers", "lightning", "pytorch_lightning", "accelerate", "peft",
              "safetensors.torch"}


def _at_import(path: Path) -> set[str]:
    """The modules `path` imports when it is imported: its module-level statements' (also under
    an `if` or `try` there), not a function's or a method's."""
    found: set[str] = set()
    package = path.relative_to(TESTS.parent).with_suffix("").parts[:-1]

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(name for _, name in imported_by(node, package))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for part in ("body", "orelse", "finalbody", "handlers"):
                    for sub in getattr(node, part, []):
                        visit(sub.body if isinstance(sub, ast.ExceptHandler) else [sub])
    visit(ast.parse(path.read_text(), str(path)).body)
    return found


def test_no_test_module_imports_a_framework_when_collected() -> None:
    bad = []
    for test in sorted(TESTS.glob("test_*.py")):
        seen, todo = set(), [test]
        while todo:
            path = todo.pop()
            for name in _at_import(path):
                if name.split(".")[0] in FRAMEWORKS or name in FRAMEWORKS:
                    bad.append(f"{test.name} -> {path.relative_to(TESTS.parent)} imports {name}")
                helper = module_path(name) if name.startswith("tests.") else None
                if helper is not None and helper not in seen:
                    seen.add(helper)
                    todo.append(helper)
    assert bad == [], ("import it in the test that uses it (or name the file by path):\n"
                       + "\n".join(sorted(set(bad))))
