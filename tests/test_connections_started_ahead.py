"""A host asked to connect ahead (`transport.connect_ahead`: `launch --all` asks as the project
loads, and its pipeline asks again for the same hosts) starts one warm-up, not one per ask; a new
host object (a later command's) starts its own."""

from __future__ import annotations

import pytest

from ablate.transport.ssh import SSHHost


def test_a_host_asked_to_connect_ahead_twice_warms_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    warmed: list[str] = []
    monkeypatch.setattr(SSHHost, "warm", lambda self: warmed.append(self.name))
    host = SSHHost("h1", "h1")
    first = host.warm_ahead()
    assert first is not None and host.warm_ahead() is None and host.warm_ahead() is None
    first.join(10)
    assert warmed == ["h1"]
    again = SSHHost("h1", "h1").warm_ahead()
    assert again is not None
    again.join(10)
    assert warmed == ["h1", "h1"]
