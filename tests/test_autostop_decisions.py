"""Autostop's decision (ablate/remote/host/autostop.py) in milliseconds: an instance stops only when
nothing runs or is left for it, everything it published is verified, it is not kept for
remediation, and its idle time has passed; the keepers are elected once, on the sweep's storage."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ablate.remote.host.autostop import Facts, Settings, decide, elect, elect_once

ON = Settings(idle=600, command="shutdown -h now", keep=1)
T = 1_800_000_000.0


def facts(**kw: object) -> Facts:
    base: dict[str, object] = {"now": T, "host": "h1", "last_work": T - 601}
    base.update(kw)
    return Facts(**base)  # type: ignore[arg-type]


def test_it_stops_only_when_everything_holds() -> None:
    v = decide(ON, facts())
    assert v.stop and v.kind == "stop" and v.stop_at == T - 1
    assert decide(None, facts()).kind == "off"
    assert decide(ON, facts(cancelled=True)).why == "autostop cancelled"


def test_what_it_waits_for_in_order() -> None:
    everything = {"running": ["q1"], "own_unclaimed": ["c1"], "unverified": {"c3": "hash mismatch"},
                  "waiting": ["c9"], "keepers": ["h1"], "last_work": T - 10}
    order = ["running", "work_left", "unverified", "kept", "idle"]
    dropped = ["running", "own_unclaimed", "unverified", "waiting"]
    for i, kind in enumerate(order):
        kw = {k: v for k, v in everything.items() if k not in dropped[:i]}
        v = decide(ON, facts(**kw))
        assert v.kind == kind and not v.stop, (kind, v)
    assert decide(ON, facts(running=["q2", "q1"])).why == "running cells: q1 q2"
    assert decide(ON, facts(stealable=["a", "b", "c", "d"])).why == \
        "work left: 4 cells it could take (a b c (+1 more))"
    assert decide(ON, facts(unverified={"c4": "hash mismatch", "c2": "missing"})).why.startswith(
        "unverified result: c2 (missing) (+1 more): its disk may hold the only good copy")
    idle = decide(ON, facts(last_work=T - 240))
    assert idle.why == "stops in 6 min" and idle.stop_at == T + 360


def test_remediation_keeps_the_elected_only_and_waits_for_the_election() -> None:
    waiting = {"waiting": ["c5"]}
    assert decide(ON, facts(keepers=["h2"], **waiting)).stop  # h2 stays, h1 may go
    kept = decide(ON, facts(keepers=["h1"], **waiting))
    assert kept.kind == "kept" and kept.why.startswith("kept for remediation: 1 cell(s)")
    undecided = decide(ON, facts(keepers=None, **waiting))
    assert undecided.kind == "kept" and "not decided yet" in undecided.why
    assert decide(ON, facts(keepers=["h1"])).stop  # nothing waits: the keeper stops too


def test_elect_fastest_ties_by_name() -> None:
    speeds = {"b": 2.0, "a": 2.0, "c": 3.0, "d": 1.0}
    assert elect(speeds, 1) == ("c",)
    assert elect(speeds, 3) == ("c", "a", "b")
    assert elect(speeds, 0) == () and elect({}, 1) == ()


def test_elect_once_decides_once_among_racers(tmp_path: Path) -> None:
    path = str(tmp_path / "autostop" / "keep.json")
    got: dict[str, tuple[str, ...]] = {}
    speeds = {"h1": 1.0, "h2": 2.0, "h3": 1.5}

    def racer(host: str, keep: int) -> None:
        got[host] = elect_once(path, speeds, keep, host, T)

    threads = [threading.Thread(target=racer, args=(h, k)) for h, k in (("h1", 1), ("h2", 2), ("h3", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got.values())) == 1  # everyone reads the same answer
    rec = json.loads(Path(path).read_text())
    assert tuple(rec["hosts"]) == got["h1"] and rec["by"] in speeds
    assert not [n for n in os.listdir(tmp_path / "autostop") if n.endswith(".tmp")]
    # speeds changed since: the decision stands
    assert elect_once(path, {"h1": 9.0, "h2": 1.0}, 1, "h1", T + 5) == got["h1"]


def test_an_unreadable_election_keeps_everyone(tmp_path: Path) -> None:
    path = tmp_path / "keep.json"
    path.write_text("{not json\n")
    assert elect_once(str(path), {"h1": 1.0, "h2": 2.0}, 1, "h1", T) == ("h1", "h2")
