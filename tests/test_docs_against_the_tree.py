"""The docs against the tree and against themselves: ARCHITECTURE.md's layout block lists every module
(compared with the files), its headings name subjects (never an issue), its contents list links to
its own headings, and every section another file cites by name is one of its headings; BENCHMARKS.md
opens with its one summary table, which names every benchmark script; every link to a heading in
these docs lands on one."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCH = REPO / "docs" / "ARCHITECTURE.md"
BENCH = REPO / "docs" / "BENCHMARKS.md"
HISTORY = REPO / "docs" / "BENCHMARKS-history.md"
LAYOUT_HEADING = "## The layout of the code"
CONTENTS_HEADING = "## Contents"
ISSUE = re.compile(r"\bissues?\s*#?\s*\d", re.IGNORECASE)
LINK = re.compile(r"\]\(#([^)\s]+)\)")
DOC_LINK = re.compile(r"\]\(([\w.-]*\.md)?#([^)\s]+)\)")
# `docs/ARCHITECTURE.md, "Run spec"`, `(ARCHITECTURE, "The host agent")`: a section cited by name
CITED = re.compile(r"ARCHITECTURE(?:\.md)?\)?,\s*\"([^\"]+)\"")
SKIP_DIRS = {".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}


def unfenced(text: str) -> Iterator[str]:
    """The lines outside fenced code blocks (a `#` line inside one is code, not a heading)."""
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            yield line


def headings(text: str) -> list[str]:
    return [line for line in unfenced(text) if re.match(r"#{1,6} ", line)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    title = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def layout_block(text: str) -> list[str]:
    """The fenced block right under the layout heading (nothing but prose between the two)."""
    lines = text.splitlines()
    assert LAYOUT_HEADING in lines, f"no {LAYOUT_HEADING!r} heading in {ARCH}"
    start = lines.index(LAYOUT_HEADING)
    opening = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    assert not any(line.startswith("#") for line in lines[start + 1:opening]), \
        f"the layout block must be the first code block under {LAYOUT_HEADING!r}"
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].startswith("```"))
    return lines[opening + 1:closing]


def listed_paths(block: list[str]) -> list[str]:
    """One path a line at its start; indented lines continue a description, `#` lines are titles."""
    return [line.split()[0] for line in block
            if line.strip() and not line[0].isspace() and not line.startswith("#")]


def defines_something(module: Path) -> bool:
    tree = ast.parse(module.read_text(encoding="utf-8"))
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)


def tree_paths() -> set[str]:
    """What the layout block must list: every `ablate/**/*.py` (an `__init__.py` only when it defines a
    function or class: the others hold a docstring and mark a package; `__main__.py` counts) and
    every file under `wrappers/` but its `__init__.py`."""
    modules = [p for p in (REPO / "ablate").rglob("*.py") if "__pycache__" not in p.parts]
    kept = [p for p in modules if p.name != "__init__.py" or defines_something(p)]
    wrappers = [p for p in (REPO / "wrappers").iterdir()
                if p.is_file() and p.name != "__init__.py" and not p.name.startswith(".")
                and p.suffix != ".pyc"]
    return {p.relative_to(REPO).as_posix() for p in [*kept, *wrappers]}


def test_the_layout_block_lists_every_module_of_the_tree() -> None:
    listed = listed_paths(layout_block(ARCH.read_text(encoding="utf-8")))
    assert listed, "the layout block lists no path"
    duplicates = sorted({p for p in listed if listed.count(p) > 1})
    assert not duplicates, f"listed twice in the layout block: {duplicates}"
    tree = tree_paths()
    missing, extra = sorted(tree - set(listed)), sorted(set(listed) - tree)
    assert not missing and not extra, (
        f"docs/ARCHITECTURE.md's layout block against the tree:\n"
        f"  in the tree, not listed: {missing}\n  listed, not in the tree: {extra}")


def test_no_heading_names_an_issue() -> None:
    for doc in (ARCH, BENCH):
        bad = [h for h in headings(doc.read_text(encoding="utf-8")) if ISSUE.search(h)]
        assert not bad, f"{doc.name}: headings name a subject, not an issue: {bad}"


def test_architecture_says_what_it_is_and_has_a_contents_list_of_its_own_headings() -> None:
    text = ARCH.read_text(encoding="utf-8")
    first = text.splitlines()[0]
    assert first.startswith("# ") and "](" not in first and "../" not in first, first
    lines = list(unfenced(text))
    assert CONTENTS_HEADING in lines, f"no {CONTENTS_HEADING!r} heading"
    start = lines.index(CONTENTS_HEADING) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    linked = LINK.findall("\n".join(lines[start:end]))
    assert linked, "the contents list links to no heading"
    anchors = [slug(h) for h in headings(text)]
    assert not [a for a in linked if a not in anchors], \
        f"contents links to no heading: {[a for a in linked if a not in anchors]}"
    sections = [slug(h) for h in headings(text) if h.startswith("## ") and h != CONTENTS_HEADING]
    assert not [s for s in sections if s not in linked], \
        f"sections missing from the contents: {[s for s in sections if s not in linked]}"


def cited_sections() -> Iterator[tuple[str, str]]:
    for path in REPO.rglob("*"):
        if (path.suffix not in {".py", ".sh", ".md", ".yaml"} or not path.is_file()
                or SKIP_DIRS.intersection(path.parts) or any(p.endswith(".egg-info") for p in path.parts)):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in CITED.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield f"{path.relative_to(REPO)}:{line}", " ".join(match.group(1).split())


def test_every_section_cited_by_name_is_a_heading_of_architecture() -> None:
    titles = [re.sub(r"[`*]", "", h.lstrip("#").strip()).lower()
              for h in headings(ARCH.read_text(encoding="utf-8"))]
    cited = list(cited_sections())
    assert cited, "no citation found: the pattern no longer matches how the code cites the docs"
    dangling = [(where, name) for where, name in cited
                if not any(t.startswith(name.lower()) for t in titles)]
    assert not dangling, f"cited sections that are no heading of docs/ARCHITECTURE.md: {dangling}"


def test_benchmarks_opens_with_one_table_naming_every_benchmark_script() -> None:
    lines = BENCH.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), lines[0]
    first_row = next(i for i, line in enumerate(lines) if line.startswith("|"))
    intro = [line for line in lines[1:first_row] if line.strip()]
    assert len(intro) <= 3, f"at most a 3-line intro before the table, got {intro}"
    header = [c.strip().lower() for c in lines[first_row].strip("|").split("|")]
    for column in ("benchmark", "target", "latest", "verdict", "date"):
        assert any(column in c for c in header), f"summary table lacks a {column!r} column: {header}"
    table = []
    for line in lines[first_row:]:
        if not line.startswith("|"):
            break
        table.append(line)
    scripts = sorted(p.name for p in (REPO / "scripts").glob("bench_*.py"))
    unlisted = [s for s in scripts if not any(s in row for row in table)]
    assert not unlisted, f"benchmark scripts missing from BENCHMARKS.md's summary table: {unlisted}"


def test_every_link_to_a_heading_in_the_docs_lands_on_one() -> None:
    anchors = {doc.name: {slug(h) for h in headings(doc.read_text(encoding="utf-8"))}
               for doc in (ARCH, BENCH, HISTORY)}
    broken = []
    for doc in (ARCH, BENCH, HISTORY):
        for target, anchor in DOC_LINK.findall(doc.read_text(encoding="utf-8")):
            if target and target not in anchors:
                continue  # another file: not a doc this test reads
            if anchor not in anchors[target or doc.name]:
                broken.append(f"{doc.name}: {target}#{anchor}")
    assert not broken, f"links to no heading: {broken}"
