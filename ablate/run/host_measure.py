"""Measure a host in one round trip: a batched `sh -c` script whose sections come back tagged.

Every value placed in a script is `shlex.quote`d; each section is `run KEY argv...`, printing a
marker line `<marker> KEY RC` and then the command's merged output. `doctor`, and the budget and
drift checks `launch` runs, build their scripts here and parse the answers with the helpers below.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ablate.transport import HostTransport

_PRELUDE = (
    # run KEY CMD...: the command's rc and merged output under one marker line.
    'run() { k=$1; shift; o=$("$@" 2>&1); r=$?; printf "%s %s %s\\n%s\\n" "$M" "$k" "$r" "$o"; }\n'
    # The nearest existing ancestor of a path: df must not need anything created.
    'up() { d=$1; while [ ! -e "$d" ] && [ "$d" != / ]; do d=$(dirname -- "$d"); done; printf %s "$d"; }\n'
    'dfat() { d=$(up "$2"); printf "%s\\n" "$d"; df -P "$1" -- "$d"; }\n'
)
_DF = re.compile(r"^(?P<fs>.*?)\s+(?P<total>\d+|-)\s+(?P<used>\d+|-)\s+(?P<free>\d+|-)\s+"
                 r"(?P<pct>\d+%|-)\s+(?P<mount>/.*)$")


@dataclass(frozen=True)
class Section:
    rc: int
    out: str

    @property
    def last(self) -> str:
        """The last non-empty output line (a one-line reason)."""
        lines = [ln.strip() for ln in self.out.splitlines() if ln.strip()]
        return lines[-1][:200] if lines else ""


@dataclass(frozen=True)
class DiskFree:
    path: str  # the existing path df was asked about
    filesystem: str
    mount: str
    total: int | None  # bytes (or inodes); None when the FS does not report it
    free: int | None


def script(sections: Sequence[tuple[str, Sequence[str]]], marker: str) -> str:
    """One `sh` script running each (key, argv) section; argv words are quoted, never interpreted.
    A first word of `dfat` or `up` calls the prelude's helper."""
    body = "".join(f"run {shlex.quote(key)} {shlex.join(argv)}\n" for key, argv in sections)
    return f"M={shlex.quote(marker)}\n{_PRELUDE}{body}"


def parse(text: str, marker: str) -> dict[str, Section]:
    out: dict[str, Section] = {}
    key: str | None = None
    rc = 0
    buf: list[str] = []
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == marker and parts[2].lstrip("-").isdigit():
            if key is not None:
                out[key] = Section(rc, "\n".join(buf).strip("\n"))
            key, rc, buf = parts[1], int(parts[2]), []
        elif key is not None:
            buf.append(line)
    if key is not None:
        out[key] = Section(rc, "\n".join(buf).strip("\n"))
    return out


def measure(transport: HostTransport, sections: Sequence[tuple[str, Sequence[str]]],
            timeout: float = 60.0) -> tuple[dict[str, Section], str | None]:
    """Run the sections on the host in one round trip: (sections answered, why the rest are
    missing or None). Raises the transport's error when the host cannot be reached."""
    marker = f"@@ablate-{secrets.token_hex(6)}"
    r = transport.run(["sh", "-c", script(sections, marker)], timeout=timeout)
    got = parse(r.stdout, marker)
    why = None
    if len(got) < len(sections):
        why = (f"the check script exited {r.rc} after {len(got)} of {len(sections)} checks: "
               f"{(r.stderr.strip() or r.stdout.strip())[-200:]!r}")
    return got, why


def parse_df(section: Section) -> DiskFree | None:
    """`dfat` output: the path on the first line, then `df -P` (-k: KiB blocks, -i: inodes)."""
    lines = [ln for ln in section.out.splitlines() if ln.strip()]
    if section.rc != 0 or len(lines) < 3:
        return None
    m = _DF.match(lines[-1].strip())
    if not m:
        return None

    def num(key: str) -> int | None:
        v = m.group(key)
        return int(v) if v.isdigit() else None

    return DiskFree(lines[0], m.group("fs"), m.group("mount"), num("total"), num("free"))




def ask_text(ask: Mapping[str, object]) -> str:
    parts = [f"{ask.get('count', 1)}x"]
    if ask.get("name"):
        parts.append(str(ask["name"]))
    if ask.get("memory"):
        parts.append(str(ask["memory"]))
    return " ".join(parts)
