"""The report's page as a browser shows it, for the report tests (tests/test_report_*.py): a tiny
DOM of its HTML, headless Chromium (the DOM after the page's script ran, screenshots), PNG
images, and a module's fixture that skips the Chromium tests where it is absent."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"


class Node:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node] = []
        self.text_parts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.text_parts + [c.text for c in self.children]).strip()

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def iter(self) -> list[Node]:
        out = [self]
        for c in self.children:
            out += c.iter()
        return out

    def find_all(self, tag: str, cls: str | None = None) -> list[Node]:
        return [n for n in self.iter() if n.tag == tag and (cls is None or cls in n.classes)]

    def by_id(self, ident: str) -> Node:
        found = [n for n in self.iter() if n.attrs.get("id") == ident]
        assert len(found) == 1, f"#{ident}: {len(found)} elements"
        return found[0]


class DomBuilder(HTMLParser):
    VOID = frozenset({"meta", "link", "br", "img", "input", "hr", "col", "source"})

    def __init__(self) -> None:
        super().__init__()
        self.root = Node("#root", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(node)
        if tag not in self.VOID:
            self.cur = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.cur.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.cur))

    def handle_endtag(self, tag: str) -> None:
        n: Node | None = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data: str) -> None:
        self.cur.text_parts.append(data)


def parse(html: str) -> Node:
    b = DomBuilder()
    b.feed(html)
    return b.root


def table_rows(table: Node) -> tuple[list[str], list[list[Node]]]:
    head = [th.text for th in table.find_all("th")]
    rows = [tr.find_all("td") for tr in table.find_all("tbody")[0].find_all("tr")]
    return head, rows


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp / 'chromium-profile'}", *args]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, (argv, p.returncode, p.stderr[-2000:])
    return p


def image(path: Path) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import image as mpimg

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return mpimg.imread(str(path))


def distinct_colours(img: Any) -> int:
    flat = (img[..., :3] * 255).round().astype("uint8").reshape(-1, 3)
    return len({tuple(px) for px in flat[:: max(1, len(flat) // 200_000)]})


def need_chromium_fixture() -> Any:
    """A module's autouse `_need_chromium`: a test named for Chromium is skipped without it."""

    @pytest.fixture(name="_need_chromium", autouse=True)
    def _need_chromium(request: pytest.FixtureRequest) -> None:
        if "chromium" in request.node.name and shutil.which(CHROMIUM) is None:
            pytest.skip(f"{CHROMIUM} is absent (scripts/test.sh installs it: apt-get install chromium)")

    return _need_chromium
