"""Each instance stops itself once its work is done and verified (issue 46), on the 3-instance test
bed with the controller absent from the launch on: `autostop: {idle, command}` where the command
records itself (its host and time, in the shared workdir) and the bed's "provider" (a thread of the
test) then takes that instance away as a cloud does (`Testbed.kill`: every process of it killed).

- hosts that finish apart (held by the trainer's `hang` marker, compressed hours) stop one by one,
  each its idle time after its own last work, never before its results are published;
- a host with work a steal gives it does not stop: it steals, and stops after its last stolen cell;
- a crashed cell keeps one instance (the elected) up until `ablate remediate --launch` re-ran it
  there; then it stops too;
- a host whose published result fails verification in place (a flipped byte) does not stop, and
  says why; mended, it stops;
- an `ablate append` onto a host in its idle time resets it: it runs the new cell, then stops its
  idle time after that;
- a stop command that fails is reported (status, the watcher's events) and the host keeps being
  flagged `idle_costing_money`.

Each scenario ends with the bed revived and the fault suite's closing checks (`Sweep.finish`: every
cell verified once, the release gate)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.faults import Sweep, sweep_fixture
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

IDLE = 4.0  # autostop.idle of the scenarios (heartbeat_secs 1)
SLACK = 8.0  # seconds past idle + a heartbeat a stop may take on a loaded machine (asserted)

sweep = sweep_fixture()


class Provider:
    """The cloud: watches the stop records the instances' stop commands write, and takes each
    recorded instance away at once (its processes killed)."""

    def __init__(self, tb: Testbed, stops: Path) -> None:
        self.tb, self.stops = tb, stops
        self.stopped: dict[str, float] = {}  # host -> when its command ran (its own record)
        self._end = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._end.is_set():
            for rec in self.stops.glob("*.stop"):
                host = rec.stem
                if host not in self.stopped and rec.read_text().strip():
                    self.stopped[host] = float(rec.read_text().split()[0])
                    self.tb.kill(host)
            time.sleep(0.05)

    def close(self) -> None:
        self._end.set()
        self._thread.join(timeout=10)
        for host in sorted(self.stopped):
            self.tb.revive(host)
        self.stopped.clear()


def autostop_sweep(make: Callable[..., Sweep], command: str | None = None,
                   **options: Any) -> tuple[Sweep, Path]:
    """A sweep whose every host stops itself `IDLE` s after its last work by a command that writes
    `<workdir>/stops/<host>.stop` (the time, then the host)."""
    probe = make(**options)
    stops = probe.work / "stops"
    stops.mkdir()
    cmd = command or f'echo "$(date +%s.%N) $ABLATE_HOST" > {stops}/"$ABLATE_HOST".stop.tmp && ' \
                     f'mv {stops}/"$ABLATE_HOST".stop.tmp {stops}/"$ABLATE_HOST".stop'
    config = yaml_config(probe)
    config["autostop"] = {"idle": f"{int(IDLE)}s", "command": cmd}
    write_config(probe, config)
    return probe, stops


def yaml_config(sw: Sweep) -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load((sw.proj / "ablate.yaml").read_text())
    return data


def write_config(sw: Sweep, config: dict[str, Any]) -> None:
    import yaml

    (sw.proj / "ablate.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


@pytest.fixture
def provider(testbed: Testbed) -> Iterator[Callable[[Path], Provider]]:
    made: list[Provider] = []

    def make(stops: Path) -> Provider:
        p = Provider(testbed, stops)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def state(sw: Sweep, host: str) -> dict[str, Any]:
    path = sw.root / "autostop" / f"{host}.state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def last_work(sw: Sweep, host: str) -> float:
    """The time of the host's last event (its queue's end, its last cell's sync or end)."""
    return max(e["t"] for e in sw.events() if e.get("host") == host)


def wait_stopped(p: Provider, host: str, timeout: float = 60) -> float:
    wait_for(lambda: host in p.stopped, timeout=timeout, interval=0.1)
    return p.stopped[host]


def assert_stopped_in_time(sw: Sweep, p: Provider, host: str) -> None:
    t = p.stopped[host]
    idle = t - last_work(sw, host)
    assert IDLE - 1.5 <= idle <= IDLE + 1 + SLACK, (host, idle)


def test_hosts_finishing_apart_stop_one_by_one(sweep: Callable[..., Sweep],
                                               provider: Callable[[Path], Provider]) -> None:
    sw, stops = autostop_sweep(sweep)
    p = provider(stops)
    h1, h2, h3 = sw.tb.hosts
    sw.fault(sw.queues[h2][1], "hang")
    sw.fault(sw.queues[h3][1], "hang")
    sw.ok("launch", "--all")
    wait_stopped(p, h1)
    assert set(p.stopped) == {h1}
    assert_stopped_in_time(sw, p, h1)
    assert set(sw.queues[h1]) <= sw.manifests()
    sw.clear(sw.queues[h2][1], "hang")
    wait_stopped(p, h2)
    assert set(p.stopped) == {h1, h2}
    assert_stopped_in_time(sw, p, h2)
    assert state(sw, h3)["kind"] == "running"
    sw.clear(sw.queues[h3][1], "hang")
    wait_stopped(p, h3)
    assert_stopped_in_time(sw, p, h3)
    assert p.stopped[h1] < p.stopped[h2] < p.stopped[h3]
    for h in sw.tb.hosts:
        st = state(sw, h)
        assert st["kind"] in ("stopping", "stopped"), st
        assert IDLE - 1.5 <= st["billed_idle"] <= IDLE + 1 + SLACK, st
    p.close()
    sw.assert_gate_closed(h1)  # self-stopped is not released: the gate still wants the roster
    sw.finish()


def test_a_host_with_work_to_steal_steals_then_stops(sweep: Callable[..., Sweep],
                                                     provider: Callable[[Path], Provider]) -> None:
    sw, stops = autostop_sweep(sweep, steal=True, queues=("tb-h1", "tb-h2"))
    p = provider(stops)
    h1, h2 = "tb-h1", "tb-h2"
    # h2's queue holds four cells (h3's two moved into it); its first one is held, so h1, drained
    # after its own two, has h2's not-started lines to steal
    sw.queues[h2] = [*sw.queues[h2], *sw.queues["tb-h3"]]
    sw.queues["tb-h3"] = []
    sw.write_queue(h2)
    held = sw.queues[h2][0]
    sw.fault(held, "hang")
    sw.ok("launch", "--all")
    wait_for(lambda: len([e for e in sw.evs("end") if e["host"] == h1]) >= 3, timeout=90, interval=0.2)
    stolen = {e["cell"] for e in sw.evs("end") if e["host"] == h1} - set(sw.queues[h1])
    assert stolen, "h1 stole nothing"
    wait_stopped(p, h1, timeout=90)
    assert h2 not in p.stopped
    assert_stopped_in_time(sw, p, h1)
    # it stopped only once a steal gave it nothing more: every line but the held one was taken
    taken = {e["cell"] for e in sw.evs("start")}
    assert taken == set(sw.cells), (taken, sw.cells)
    sw.clear(held, "hang")
    wait_stopped(p, h2)
    assert_stopped_in_time(sw, p, h2)
    p.close()
    sw.assert_gate_closed(h1)
    sw.finish()


def test_a_crashed_cell_keeps_one_host_until_remediated(sweep: Callable[..., Sweep],
                                                        provider: Callable[[Path], Provider]) -> None:
    sw, stops = autostop_sweep(sweep)
    p = provider(stops)
    crashed = sw.queues["tb-h2"][0]
    sw.fault(crashed, "oom")
    sw.ok("launch", "--all")
    # two instances stop; the elected one stays, kept for remediation, and says so
    wait_for(lambda: len(p.stopped) == 2, timeout=90, interval=0.1)
    [kept] = [h for h in sw.tb.hosts if h not in p.stopped]
    wait_for(lambda: state(sw, kept).get("kind") == "kept", timeout=30)
    assert crashed in state(sw, kept)["why"]
    time.sleep(IDLE + 2)  # past its idle time: it stays
    assert kept not in p.stopped and state(sw, kept)["kind"] == "kept"
    sw.assert_gate_closed(kept)
    sw.clear(crashed, "oom")
    sw.ok("remediate", "--launch")
    wait_stopped(p, kept, timeout=90)
    assert crashed in sw.manifests()
    assert_stopped_in_time(sw, p, kept)
    p.close()
    sw.finish()


def test_a_result_that_fails_verification_keeps_its_host_up(sweep: Callable[..., Sweep],
                                                            provider: Callable[[Path], Provider]) -> None:
    sw, stops = autostop_sweep(sweep)
    p = provider(stops)
    h1 = "tb-h1"
    first, second = sw.queues[h1]
    sw.fault(second, "hang")
    sw.ok("launch", "--all")
    sw.wait_synced([first])
    ckpt = sw.root / "final_ckpts" / first / "model.safetensors"
    data = bytearray(ckpt.read_bytes())
    data[-1] ^= 0xFF  # a flipped byte in its published copy
    ckpt.write_bytes(bytes(data))
    sw.clear(second, "hang")
    wait_for(lambda: state(sw, h1).get("kind") == "unverified", timeout=60)
    assert first in state(sw, h1)["why"] and "sha256" in state(sw, h1)["why"], state(sw, h1)
    wait_for(lambda: len(p.stopped) == 2, timeout=60, interval=0.1)
    time.sleep(IDLE + 2)
    assert h1 not in p.stopped and state(sw, h1)["kind"] == "unverified"
    status = sw.ok("status")
    assert "unverified result" in json.dumps(status["autostop"][h1]), status["autostop"]
    data[-1] ^= 0xFF  # mended in place (as a copy from the instance's own disk would)
    ckpt.write_bytes(bytes(data))
    wait_stopped(p, h1, timeout=60)
    p.close()
    sw.assert_gate_closed(h1)
    sw.finish()


def test_an_append_in_the_idle_time_resets_it(sweep: Callable[..., Sweep],
                                              provider: Callable[[Path], Provider]) -> None:
    sw, stops = autostop_sweep(sweep, queues=("tb-h1",))
    p = provider(stops)
    h1 = "tb-h1"
    sw.ok("launch", "--all")
    sw.wait_synced(sw.queues[h1])
    wait_for(lambda: state(sw, h1).get("kind") == "idle", timeout=30)
    first_stop_at = state(sw, h1)["stop_at"]
    extra = sw.queues["tb-h2"][0]
    sw.fault(extra, "hang")
    sw.ok("append", h1, sw.cfg(extra), "recon")
    wait_for(lambda: sw.epochs_done(h1, extra) >= 1, timeout=60)
    assert h1 not in p.stopped
    time.sleep(max(0.0, first_stop_at - time.time()) + 2)  # past the stop it would have made
    assert h1 not in p.stopped and state(sw, h1)["kind"] == "running"
    sw.clear(extra, "hang")
    wait_stopped(p, h1, timeout=60)
    assert_stopped_in_time(sw, p, h1)
    assert p.stopped[h1] > first_stop_at + IDLE / 2
    p.close()
    sw.cells = [*sw.queues[h1], extra]
    sw.assert_gate_closed(h1)
    sw.finish()


def test_a_stop_command_that_fails_is_reported(sweep: Callable[..., Sweep],
                                               provider: Callable[[Path], Provider]) -> None:
    sw, stops = autostop_sweep(sweep, command="echo 'sh: vastai: command not found' >&2; exit 127",
                               queues=("tb-h1",))
    p = provider(stops)
    h1 = "tb-h1"
    sw.cells = list(sw.queues[h1])
    sw.ok("launch", "--all")
    wait_for(lambda: state(sw, h1).get("kind") == "stop_failed", timeout=60)
    st = state(sw, h1)
    assert st["stop_rc"] == 127 and "vastai: command not found" in st["why"], st
    events = [json.loads(x) for x in (sw.root / "autostop" / f"{h1}.jsonl").read_text().splitlines()]
    assert [e for e in events if e["ev"] == "stop_failed" and e["rc"] == 127]
    status = sw.ok("status")
    assert status["autostop"][h1]["kind"] == "stop_failed", status["autostop"]
    assert any(a["host"] == h1 and a["state"] == "idle_costing_money" and a.get("stop_failed")
               for a in status["idle_hosts"]), status["idle_hosts"]
    assert not p.stopped
    sw.assert_gate_closed(h1)
    sw.finish()
