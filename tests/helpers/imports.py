"""What a Python file imports, read from its syntax tree (never by importing it): the layout
checks' scan and the shipped code's closure."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported(path: Path, root: Path = REPO) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every module `path` (under `root`) may import, at any depth:
    `import M` gives M, `from M import n` gives M and M.n (n may be a submodule); relative
    imports resolved."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    yield from _imports_of(path.read_text(), str(path), package)


@functools.cache
def _imports_of(source: str, filename: str, package: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
    """`imported_by` of a source, parsed once per process: several layout checks scan every file
    (keyed by the source itself, so a file that changed is read anew)."""
    return tuple(imported_by(ast.parse(source, filename), package))


def imported_by(tree: ast.AST, package: tuple[str, ...] = ()) -> Iterator[tuple[int, str]]:
    """`imported` of a parsed source (a module in `package`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def module_path(name: str, root: Path = REPO) -> Path | None:
    """The source file of module `name` under `root` (a package's `__init__.py`), if there is one."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def closure(sources: Iterable[str], prefix: str = "ablate.", root: Path = REPO) -> set[str]:
    """Every module under `prefix` that the given sources import, at any depth (function-local
    imports too), packages' `__init__` left out: the modules a program of those sources runs."""
    todo = [name for src in sources for _, name in imported_by(ast.parse(src))]
    found: set[str] = set()
    while todo:
        name = todo.pop()
        path = module_path(name, root)
        if not name.startswith(prefix) or name in found or path is None:
            continue
        if path.name == "__init__.py":
            continue
        found.add(name)
        todo.extend(dep for _, dep in imported(path, root))
    return found
