"""The manual against the code and against itself: every ```yaml example in README.md and the topic
pages under docs/ loads with ablate's own config loader, as written, into the file its first line
names (`# ablate.yaml`, or `# profiles/<name>.yaml`); the Slurm and object-store examples give what
their pages say; every relative link in README.md and docs/*.md lands on a file, and on a heading
of it when it names one; the README links every page; the pages use headings, never bold
paragraphs, and name no module of the code (that is ARCHITECTURE.md's to do)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.config.project import Project, load_profile, load_project
from ablate.config.slurm import SLURM_KEYS

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
# Checked by tests/test_docs_against_the_tree.py, with rules of their own; no manual example lives in them.
NOT_MANUAL = {"ARCHITECTURE.md", "BENCHMARKS.md", "BENCHMARKS-history.md"}
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
# The first line of an example: the file it belongs in.
TARGET = re.compile(r"#\s*(ablate\.yaml|profiles/([a-z0-9_-]+)\.yaml)\s*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
INLINE_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:")
# A module or package of the code (`ablate/remote/…`), which the manual leaves to ARCHITECTURE.md.
CODE_PATH = re.compile(r"\bablate/[\w.-][\w./-]*")


def manual_pages() -> list[Path]:
    """README.md and the topic pages of docs/ (not ARCHITECTURE.md or the benchmarks)."""
    return [README, *sorted(p for p in DOCS.glob("*.md") if p.name not in NOT_MANUAL)]


def all_docs() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def split_fences(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(the text outside fenced blocks, each fenced block as (language, body))."""
    outside: list[str] = []
    blocks: list[tuple[str, str]] = []
    body: list[str]
    fence: str | None = None
    lang, body = "", []
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence, lang, body = m.group(1), m.group(2).lower(), []
        elif fence is not None and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            blocks.append((lang, "".join(f"{b}\n" for b in body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            outside.append(line)
    assert fence is None, "a fenced block is never closed"
    return "\n".join(outside), blocks


def yaml_examples(page: Path) -> list[str]:
    blocks = split_fences(page.read_text(encoding="utf-8"))[1]
    return [body for lang, body in blocks if lang in {"yaml", "yml"}]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    title = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated one gets GitHub's -1, -2, … suffixes."""
    outside, _ = split_fences(page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for line in outside.splitlines():
        if re.match(r"#{1,6} ", line):
            base = slug(line)
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> Iterator[str]:
    """Every link target outside code (fenced blocks and code spans)."""
    outside, _ = split_fences(page.read_text(encoding="utf-8"))
    prose = CODE_SPAN.sub("", outside)
    yield from INLINE_LINK.findall(prose)
    yield from REF_LINK.findall(prose)


# --------------------------------------------------------------------------- examples as written

BASE: dict[str, Any] = {
    "profile": "local",
    "sweep": "docs",
    "train": "python train.py --config {cfg} --out {ckpt_dir} --resume {resume}",
    "artifacts": {"checkpoint": "model.pt"},
    "tasks": {"t": {"epochs": 2, "cost_per_epoch": 1.0}},
    "cells": [{"glob": "configs/*.yaml", "task": "t"}],
    "hosts": {"h1": {"gpus": [0, 1]}},
}


class PageProject:
    """A project holding a page's examples: each profile example under profiles/, each ablate.yaml
    example merged over a small valid ablate.yaml (its top-level keys replace the base's)."""

    def __init__(self, page: Path, root: Path) -> None:
        self.page, self.root = page, root
        for i in range(3):
            cfg = root / "configs" / f"c{i}.yaml"
            cfg.parent.mkdir(parents=True, exist_ok=True)
            cfg.write_text(f"lr: 0.1\nseed: {i}\n")
        (root / "profiles").mkdir()
        self.examples: list[tuple[str, str]] = []
        for body in yaml_examples(page):
            first = body.splitlines()[0] if body.strip() else ""
            m = TARGET.fullmatch(first.strip())
            assert m, (f"{page.name}: a yaml example must start with a comment naming its file "
                       f"(`# ablate.yaml` or `# profiles/NAME.yaml`), got {first!r}")
            self.examples.append((m.group(1), body))
            if m.group(2):
                (root / "profiles" / f"{m.group(2)}.yaml").write_text(body)

    def profiles(self) -> list[str]:
        return [target.removeprefix("profiles/").removesuffix(".yaml")
                for target, _ in self.examples if target != "ablate.yaml"]

    def configs(self) -> list[str]:
        return [body for target, body in self.examples if target == "ablate.yaml"]

    def load(self, body: str) -> Project:
        """load_project on the base ablate.yaml with this example's keys over it."""
        data = yaml.safe_load(body)
        assert isinstance(data, dict), f"{self.page.name}: an ablate.yaml example is a mapping: {body!r}"
        cfg = {**BASE, "workdir": str(self.root), **data}
        (self.root / "ablate.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        return load_project(self.root)


@pytest.mark.parametrize("page", manual_pages(), ids=lambda p: p.name)
def test_every_yaml_example_parses_and_loads_into_the_file_it_names(page: Path, tmp_path: Path) -> None:
    for body in yaml_examples(page):
        yaml.safe_load(body)  # any YAML error names the page through pytest's id
    project = PageProject(page, tmp_path)
    for name in project.profiles():
        profile = load_profile(name, tmp_path, page.name)
        assert profile.source.endswith(f"profiles/{name}.yaml"), profile.source
    for body in project.configs():
        project.load(body)


def test_the_manual_has_yaml_examples() -> None:
    """The pattern still finds the examples (else the test above would pass on nothing)."""
    assert sum(len(yaml_examples(p)) for p in manual_pages()) >= 5


def test_the_slurm_pages_example_profile_and_host_load(tmp_path: Path) -> None:
    """docs/slurm.md's example, as written, is a valid profile and host entry."""
    project = PageProject(DOCS / "slurm.md", tmp_path)
    assert project.profiles() == ["slurm"] and len(project.configs()) == 1, project.examples
    profile = yaml.safe_load((tmp_path / "profiles" / "slurm.yaml").read_text())
    assert set(profile["slurm"]) == SLURM_KEYS, "the page's example shows every key"
    entry = yaml.safe_load(project.configs()[0])
    assert set(entry) == {"profile", "hosts"}, entry
    p = project.load(project.configs()[0])
    host = p.hosts["cluster"]
    assert p.profile.source.endswith("profiles/slurm.yaml") and host.slots == (0, 1, 2, 3)
    assert host.profile.slurm is not None
    assert host.profile.slurm.sbatch_options() == [
        "--partition=gpu,gpu-long", "--account=mylab", "--qos=normal", "--time=1-00:00:00", "--gres=gpu:1",
        "--requeue", "--signal=B:USR2@120", "--constraint=a100|h100", "--cpus-per-task=8", "--mem=64G"]


def test_the_no_shared_fs_pages_example_profile_loads_as_written(tmp_path: Path) -> None:
    """docs/no-shared-fs.md's example, as written, is a valid storage profile."""
    page = DOCS / "no-shared-fs.md"
    project = PageProject(page, tmp_path)
    assert len(project.profiles()) == 1 and not project.configs(), project.examples
    p = load_profile(project.profiles()[0], tmp_path, "t")
    assert p.storage == "s3://my-bucket/ablate-sweeps" and p.transport == "ssh"
    assert p.storage_endpoint == "https://ACCOUNT.r2.cloudflarestorage.com"
    text = " ".join(page.read_text(encoding="utf-8").split())  # wherever the lines wrap
    for needle in ("conditional create", "committed", "conditional writes", "LastModified", "412",
                   "AWS chain", "process environment only", "boto3", "tmux"):
        assert needle in text, needle


# --------------------------------------------------------------------------- links and headings

def test_every_relative_link_lands_on_a_file_and_a_heading_of_it() -> None:
    broken = []
    for page in all_docs():
        for target in links(page):
            if SCHEME.match(target):
                continue  # https:, mailto:: not a file of the repo
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, "links that land nowhere:\n" + "\n".join(broken)


def test_the_readme_links_every_page_of_docs() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README) if not SCHEME.match(t)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md links no line to these pages: {missing}"


def test_the_pages_use_headings_and_leave_the_code_to_architecture() -> None:
    """A topic is a heading one can link to, never a paragraph opening in bold; module paths move
    with the code, so the manual links ARCHITECTURE.md instead of naming them."""
    bad = []
    for page in manual_pages():
        outside, _ = split_fences(page.read_text(encoding="utf-8"))
        paragraphs = re.split(r"\n\s*\n", outside)
        bad += [f"{page.name}: bold paragraph {p.strip()[:40]!r}: make it a heading"
                for p in paragraphs if p.lstrip().startswith("**")]
        prose = CODE_SPAN.sub(lambda m: m.group(0).strip("`"), outside)
        named = [m.rstrip("/.,;:") for m in CODE_PATH.findall(prose)]
        bad += [f"{page.name}: names {m!r}: link docs/ARCHITECTURE.md instead"
                for m in named if m.endswith(".py") or (REPO / m).exists()]
    assert not bad, "\n".join(bad)

