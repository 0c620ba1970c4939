"""What a cell will resume from, as `status` and `remediate` say it before it runs (issue 45): its
newest durable resume copy on the sweep (`resume/<cell>/`, ablate/remote/resume/; read by the
probe's snapshot) or nothing. Pure: from the snapshot's `extra["resume"]` and the cells' states."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ablate.sweep.classify import CellState
from ablate.util.fmt import duration

# Cut or failed mid-run, to run again (remediate, a relaunch, a requeue): from a copy, or not
AGAIN = ("hung", "lost", "interrupted", "oom", "crashed", "service_down", "too_long")


def resume_from(copies: Mapping[str, Any], cells: Mapping[str, CellState], now: float) -> dict[str, Any]:
    """cell -> {"from": "copy", "seq", "step", "what", "age", "made_on"} for a running cell with a
    copy (its durable progress) or a cell that will run again, else {"from": "none"} for the latter."""
    out: dict[str, Any] = {}
    for name, st in cells.items():
        have = copies.get(name) if isinstance(copies, Mapping) else None
        newest = have[0] if isinstance(have, list) and have and isinstance(have[0], dict) else None
        if st.state != "running" and st.state not in AGAIN:
            continue
        if newest is None:
            if st.state != "running":
                out[name] = {"from": "none"}
            continue
        t = newest.get("committed")
        out[name] = {"from": "copy", "seq": newest.get("seq"), "step": newest.get("step"),
                     "what": ", ".join(str(x) for x in newest.get("top") or []) or None,
                     "age": round(now - t, 1) if isinstance(t, (int, float)) else None,
                     "made_on": newest.get("made_on")}
    return out


def text(rec: Mapping[str, Any]) -> str:
    """"checkpoint-30 (step 30), 4m old, made on h1" or "from scratch: nothing durable"."""
    if rec.get("from") != "copy":
        return "from scratch: nothing durable"
    step = f" (step {rec['step']})" if rec.get("step") is not None else ""
    age = f", {duration(rec['age'])} old" if rec.get("age") is not None else ""
    return f"{rec.get('what') or 'its checkpoint'}{step}{age}, made on {rec.get('made_on') or '?'}"


def lines(resume: Mapping[str, Any], cells: Mapping[str, CellState]) -> list[str]:
    out = []
    for name, rec in resume.items():
        st = cells.get(name)
        if st is None:
            continue
        if st.state == "running":
            out.append(f"  {name} durable so far: {text(rec)}")
        elif rec.get("from") == "copy":
            out.append(f"  {name} ({st.state}) will resume from {text(rec)}")
        else:
            out.append(f"  {name} ({st.state}) will start from scratch: nothing durable to resume from")
    return out
